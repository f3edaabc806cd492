//! `ANY /v1/sandboxes/{id}/ports/{port}[/{path}]`: HTTP to a server listening on a TCP port
//! inside the sandbox. The route is one wildcard, `/v1/sandboxes/{id}/ports/{*target}`, so
//! the bare port, a trailing slash and any path match it; the port is the segment after
//! `ports`.
//!
//! The manager hands out a byte stream to `127.0.0.1:<port>` inside the sandbox
//! ([`Ports::connect_port`]); this file speaks HTTP/1.1 over it, one connection per
//! request: the caller's request goes out (method, the path after the port and the query as
//! written, headers without hop-by-hop ones and without `Authorization`, which is Warren's
//! token; the body streamed), the server's answer comes back (status, headers, body
//! streamed). An upgrade (WebSocket) is spliced byte for byte once the server answers 101.
//! Errors of Warren's own (bad port, unknown sandbox, nothing listening) are JSON errors;
//! anything the server answers, errors included, is passed on as it is.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode, Uri, Version};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tracing::debug;
use warren_types::http::{is_upgrade, strip_hop_by_hop};
use warren_types::{ApiError, ErrorCode, SandboxId};

use super::error::{HttpError, HttpResult};
use super::extract::SandboxParam;
use crate::manager::Ports;

/// Header naming the caller's `Host`, for servers that build absolute links.
const FORWARDED_HOST: &str = "x-forwarded-host";
/// Header naming the path prefix the server is reached under (`/v1/sandboxes/<id>/ports/<port>`).
const FORWARDED_PREFIX: &str = "x-forwarded-prefix";
/// Header added to every answer that comes from the server (its value: the port), so a
/// client tells them from Warren's own errors.
pub const PORT_HEADER: &str = "warren-port";

/// A `{port}` path parameter: 1-65535.
pub(crate) fn port(s: &str) -> Result<u16, HttpError> {
    s.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| HttpError::invalid(format!("port must be a number 1-65535, got {s:?}")))
}

/// The path to ask the server for: what follows `/v1/sandboxes/<id>/ports/<port>` in the
/// caller's path, as written (percent-encoding kept), or `/`.
pub(crate) fn inner_path(path: &str) -> &str {
    // The sixth slash starts the rest: /v1/sandboxes/<id>/ports/<port>/rest.
    match path.match_indices('/').nth(5) {
        Some((i, _)) => &path[i..],
        None => "/",
    }
}

fn port_error(port: u16, message: String) -> HttpError {
    ApiError::new(
        ErrorCode::PortUnreachable,
        format!("port {port}: {message}"),
    )
    .into()
}

/// The port segment of `/v1/sandboxes/<id>/ports/<port>[/...]`, as written.
pub(crate) fn port_segment(path: &str) -> &str {
    path.split('/').nth(5).unwrap_or("")
}

pub async fn forward(
    State(m): State<Ports>,
    SandboxParam(id): SandboxParam,
    req: Request,
) -> HttpResult<Response> {
    let port = port(port_segment(req.uri().path()))?;
    let req = outbound(req, &id, port)?;
    let conn = m.connect_port(&id, port).await?;
    send(req, conn, port).await
}

/// The request as the server inside gets it, with the caller's upgrade (if any) in its
/// extensions.
fn outbound(req: Request, id: &SandboxId, port: u16) -> HttpResult<Request> {
    let (mut parts, body) = req.into_parts();
    let path = inner_path(parts.uri.path());
    let pq = match parts.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_string(),
    };
    let uri: Uri = pq
        .parse()
        .map_err(|e| HttpError::invalid(format!("bad path {pq:?}: {e}")))?;
    let upgrade = is_upgrade(&parts.headers).then(|| {
        (
            parts.headers.get(header::UPGRADE).cloned(),
            parts.headers.get(header::CONNECTION).cloned(),
        )
    });
    // HTTP/2 carries the host in the URI's authority, HTTP/1.1 in `Host`.
    let caller_host = parts.headers.get(header::HOST).cloned().or_else(|| {
        let a = parts.uri.authority()?;
        HeaderValue::from_str(a.as_str()).ok()
    });
    let h = &mut parts.headers;
    strip_hop_by_hop(h);
    h.remove(header::AUTHORIZATION);
    if let Some((up, conn)) = upgrade {
        if let Some(up) = up {
            h.insert(header::UPGRADE, up);
        }
        h.insert(
            header::CONNECTION,
            conn.unwrap_or(HeaderValue::from_static("upgrade")),
        );
    } else {
        parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
    }
    let host = HeaderValue::from_str(&format!("localhost:{port}")).expect("a valid host");
    h.insert(header::HOST, host);
    if let Some(v) = caller_host {
        h.insert(FORWARDED_HOST, v);
    }
    let prefix = warren_types::routes::port_prefix(id.as_str(), port);
    h.insert(
        FORWARDED_PREFIX,
        HeaderValue::from_str(&prefix).expect("ids and ports are header-safe"),
    );
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(parts, body))
}

/// Sends `req` over a fresh HTTP/1.1 connection on `conn` and answers what comes back.
async fn send(
    mut req: Request,
    conn: crate::manager::PortConnection,
    port: u16,
) -> HttpResult<Response> {
    let client_upgrade = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>();
    // The sandbox stays busy for as long as the connection (or its upgrade) is open.
    let guard = Arc::new(conn.guard);
    let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(TokioIo::new(conn.stream))
        .await
        .map_err(|e| port_error(port, format!("cannot start HTTP: {e}")))?;
    let held = guard.clone();
    tokio::spawn(async move {
        let _busy = held;
        if let Err(e) = connection.with_upgrades().await {
            debug!(port, error = %e, "connection to a sandbox port ended");
        }
    });
    let answer = sender.send_request(req).await;
    // No second request on this connection: it closes once the answer's body is read.
    drop(sender);
    let mut resp = answer.map_err(|e| {
        port_error(
            port,
            format!("the server closed the connection without an HTTP answer ({e})"),
        )
    })?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_side) = client_upgrade else {
            return Err(port_error(
                port,
                "the server switched protocols on a plain request".into(),
            ));
        };
        let server_side = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let _busy = guard;
            match tokio::try_join!(client_side, server_side) {
                Ok((c, s)) => {
                    let (mut c, mut s) = (TokioIo::new(c), TokioIo::new(s));
                    if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut s).await {
                        debug!(port, error = %e, "upgraded connection to a sandbox port ended");
                    }
                }
                Err(e) => debug!(port, error = %e, "upgrade to a sandbox port failed"),
            }
        });
        let (mut parts, _) = resp.into_parts();
        parts.headers.insert(PORT_HEADER, HeaderValue::from(port));
        parts.version = Version::HTTP_11;
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.insert(PORT_HEADER, HeaderValue::from(port));
    // The server's HTTP version is its own connection's business (an HTTP/1.0 server must
    // not turn the caller's connection into a 1.0 one).
    parts.version = Version::HTTP_11;
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rest_of_the_path_goes_in() {
        assert_eq!(inner_path("/v1/sandboxes/n1-x/ports/80"), "/");
        assert_eq!(inner_path("/v1/sandboxes/n1-x/ports/80/"), "/");
        assert_eq!(
            inner_path("/v1/sandboxes/n1-x/ports/80/a/b%20c/"),
            "/a/b%20c/"
        );
        assert_eq!(inner_path("/v1/sandboxes/n1-x/ports/80//x"), "//x");
    }

    #[test]
    fn the_port_is_the_segment_after_ports() {
        assert_eq!(port_segment("/v1/sandboxes/n1-x/ports/80"), "80");
        assert_eq!(port_segment("/v1/sandboxes/n1-x/ports/80/"), "80");
        assert_eq!(port_segment("/v1/sandboxes/n1-x/ports/80/a/b"), "80");
        assert_eq!(port_segment("/v1/sandboxes/n1-x/ports/"), "");
    }

    #[test]
    fn ports_are_1_to_65535() {
        assert_eq!(port("8000").unwrap(), 8000);
        assert_eq!(port("65535").unwrap(), 65535);
        for bad in ["0", "65536", "-1", "http", "", "80.0", " 80"] {
            let e = port(bad).unwrap_err();
            assert_eq!(e.error.code, ErrorCode::InvalidRequest, "{bad}");
        }
    }
}
