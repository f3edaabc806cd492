//! E2B's `envd`, the data plane inside each E2B sandbox, served by translating its calls into
//! Warren's v1 API.
//!
//! `envd` speaks the Connect protocol (services `process.Process` and `filesystem.Filesystem`)
//! and plain HTTP (`GET/POST /files`, `/health`). [`Envd::serve`] answers one such request for
//! one sandbox; the caller (the E2B front, `warren-e2b`) has authenticated it already. Every
//! call becomes one or more in-process requests to the v1 router, carrying the
//! [`warren_types::Caller`] in their extensions, so they are logged, limited and answered
//! exactly like native calls.

pub mod connect;

use axum::extract::Request;
use axum::response::Response;
use warren_types::Caller;

use crate::connect::{CallKind, Code, ConnectError};

/// E2B's envd, served for one sandbox at a time by translating into Warren's v1 API.
#[derive(Clone)]
pub struct Envd {
    native: axum::Router,
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
        Envd { native }
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
        let _ = (&self.native, sandbox, caller, user);
        let kind = CallKind::of_or_unary(req.headers());
        ConnectError::new(
            Code::Unimplemented,
            format!("{} is not implemented yet", req.uri().path()),
        )
        .into_response(kind)
    }
}
