//! E2B's `envd`, the data plane inside each E2B sandbox, served by translating its calls into
//! Warren's v1 API.
//!
//! `envd` speaks the Connect protocol (services `process.Process` and `filesystem.Filesystem`,
//! JSON or protobuf, unary and streaming) and plain HTTP (`GET/POST /files`, `/health`).
//! [`Envd::serve`] answers one such request for one sandbox; the caller (the E2B front,
//! `warren-e2b`) has authenticated it already. Every call becomes in-process requests to the
//! v1 router carrying the [`warren_types::Caller`] in their extensions, so they are checked,
//! logged and answered exactly like native calls: commands are attached (or, without stdin,
//! streamed) execs ([`process`]), files are the file routes ([`filesystem`], [`files`]).

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod pb;
pub mod process;
pub mod users;
pub mod v1;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use warren_types::Caller;

use crate::connect::{CallKind, Code, ConnectError};

/// The envd version this crate serves (what the SDK gates features on: stdin closing,
/// octet-stream uploads, entries in watch events all need at least this).
pub const ENVD_VERSION: &str = "0.6.4";

/// E2B's envd, served for one sandbox at a time by translating into Warren's v1 API.
#[derive(Clone)]
pub struct Envd {
    inner: Arc<Inner>,
}

struct Inner {
    v1: v1::V1,
    procs: Arc<process::Procs>,
    watchers: filesystem::Watchers,
    users: users::Users,
}

impl std::fmt::Debug for Envd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envd").finish_non_exhaustive()
    }
}

impl Envd {
    /// `native` is Warren's v1 API router (a node's `warren_node::router(node)` or the
    /// gateway's), WITHOUT the edge's authentication: each request this crate sends it
    /// carries the `warren_types::Caller` in its extensions (the node's extractors read it).
    pub fn new(native: axum::Router) -> Self {
        Envd {
            inner: Arc::new(Inner {
                v1: v1::V1::new(native),
                procs: Arc::default(),
                watchers: filesystem::Watchers::default(),
                users: users::Users::default(),
            }),
        }
    }

    /// Serves one envd request (already authenticated by warren-e2b) for `sandbox` as `caller`;
    /// `user` is the Basic-auth user name the SDK sent, if any.
    pub async fn serve(
        &self,
        sandbox: &str,
        caller: Caller,
        user: Option<String>,
        req: Request,
    ) -> Response {
        let inner = &*self.inner;
        let sb = inner.v1.sandbox(sandbox, caller);
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        match (method, path.as_str()) {
            (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
            (Method::GET, "/files") => files::download(&sb, user, req).await,
            (Method::POST, "/files") => files::upload(&sb, &inner.users, user, req).await,
            (m, p) => {
                let kind = CallKind::of_or_unary(req.headers());
                let Some((service, rpc)) = p.strip_prefix('/').and_then(|p| p.split_once('/'))
                else {
                    return not_found(p);
                };
                if !matches!(service, "process.Process" | "filesystem.Filesystem") {
                    return not_found(p);
                }
                if m != Method::POST {
                    return ConnectError::new(
                        Code::Unimplemented,
                        format!("{m} {p}: Connect calls are POSTs"),
                    )
                    .into_response(kind);
                }
                if CallKind::of(req.headers()).is_none() {
                    return ConnectError::invalid(
                        "Content-Type must be application/json, application/proto, application/connect+json or application/connect+proto",
                    )
                    .into_response(kind);
                }
                if let Some(v) = req.headers().get("connect-protocol-version") {
                    if v.as_bytes() != b"1" {
                        return ConnectError::invalid("Connect-Protocol-Version must be 1")
                            .into_response(kind);
                    }
                }
                let (parts, body) = req.into_parts();
                if service == "process.Process" {
                    process::Call {
                        procs: &inner.procs,
                        users: &inner.users,
                        sandbox: sb,
                        user,
                        kind,
                        headers: parts.headers,
                        body,
                    }
                    .serve(rpc)
                    .await
                } else {
                    filesystem::Call {
                        watchers: &inner.watchers,
                        users: &inner.users,
                        sandbox: sb,
                        user,
                        kind,
                        headers: parts.headers,
                        body,
                    }
                    .serve(rpc)
                    .await
                }
            }
        }
    }

    /// Forgets what this envd remembers of a sandbox (its users, its watchers), for the
    /// front to call when the sandbox is killed. Its commands end with the sandbox.
    pub fn forget(&self, sandbox: &str) {
        self.inner.users.forget(sandbox);
        self.inner.watchers.forget(sandbox);
    }
}

fn not_found(path: &str) -> Response {
    files::http_error(&ConnectError::new(
        Code::NotFound,
        format!("no envd route {path}"),
    ))
}
