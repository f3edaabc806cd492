//! Which way a request goes: to a sandbox (envd or another port), to E2B's control plane, or
//! to Warren's own API. Pure functions of the request's head, so they are tested and fuzzed
//! without a server.
//!
//! A request is for a sandbox when it carries `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`,
//! default envd's port), as the SDKs send with `E2B_SANDBOX_URL` and on every envd call, or
//! when its host is `{port}-{sandbox id}.{domain}` with the server's `--e2b-domain`, as
//! `sandbox.get_host(port)` names it. Warren's routes (`/v1/…`, `/metrics`, `/ui`) keep
//! their meaning; every other path is E2B's control plane.

use axum::http::{HeaderMap, Uri};
use warren_types::SandboxId;

use crate::error::E2bError;

/// envd's port inside an E2B sandbox.
pub const ENVD_PORT: u16 = 49983;

/// Header naming the sandbox of a data-plane request.
pub const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";
/// Header naming the port of a data-plane request.
pub const SANDBOX_PORT_HEADER: &str = "e2b-sandbox-port";

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A port of a sandbox: envd when `port` is [`ENVD_PORT`].
    Sandbox { id: SandboxId, port: u16 },
    /// E2B's control plane (`/sandboxes`, `/v2/sandboxes`, `/templates`, ...).
    Control,
    /// Warren's own API and dashboard, unchanged.
    Native,
}

/// Decides where a request goes. `domain` is the server's `--e2b-domain`, if any.
pub fn classify(headers: &HeaderMap, uri: &Uri, domain: Option<&str>) -> Result<Target, E2bError> {
    if let Some(id) = headers.get(SANDBOX_ID_HEADER) {
        let id = id
            .to_str()
            .map_err(|_| E2bError::BadRequest("E2b-Sandbox-Id is not text".into()))?;
        let port = match headers.get(SANDBOX_PORT_HEADER) {
            None => ENVD_PORT,
            Some(p) => p
                .to_str()
                .ok()
                .and_then(|p| parse_port(p.trim()))
                .ok_or_else(|| {
                    E2bError::BadRequest("E2b-Sandbox-Port must be a port number (1-65535)".into())
                })?,
        };
        return Ok(Target::Sandbox {
            id: sandbox_id(id.trim())?,
            port,
        });
    }
    if let Some(domain) = domain {
        let host = uri
            .host()
            .map(str::to_string)
            .or_else(|| {
                headers
                    .get(axum::http::header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        if let Some((port, id)) = sandbox_host(&host, domain) {
            return Ok(Target::Sandbox {
                id: sandbox_id(id)?,
                port,
            });
        }
    }
    if is_native(uri.path()) {
        return Ok(Target::Native);
    }
    Ok(Target::Control)
}

/// Warren's own paths: `/v1/…`, the dashboard, and every other literal route of the node API
/// (`/metrics`, `/run_code`, ...).
fn is_native(path: &str) -> bool {
    path.starts_with("/v1/")
        || path == "/v1"
        || path == "/ui"
        || path.starts_with("/ui/")
        || warren_types::routes::NODE_API
            .iter()
            .any(|(_, p)| !p.contains('{') && *p == path)
}

fn sandbox_id(s: &str) -> Result<SandboxId, E2bError> {
    s.parse::<SandboxId>()
        .map_err(|_| E2bError::NotFound(format!("sandbox {s:?} not found (not a sandbox id)")))
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u16>().ok().filter(|p| *p > 0)
}

/// `{port}-{id}.{domain}[:port]` → `(port, id)`; anything else is not a sandbox host.
pub fn sandbox_host<'a>(host: &'a str, domain: &str) -> Option<(u16, &'a str)> {
    let domain = domain.trim_matches('.');
    if domain.is_empty() {
        return None;
    }
    // Strip a `:port` (not inside an IPv6 literal, which never names a sandbox anyway).
    let host = match host.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    Some((parse_port(port)?, id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const ID: &str = "n1-01hzzzzzzzzzzzzzzzzzzzzzzz";

    fn id() -> SandboxId {
        ID.parse()
            .unwrap_or_else(|_| SandboxId::generate(&"n1".parse().unwrap()))
    }

    fn heads(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn headers_name_the_sandbox_and_port() {
        let id = id();
        let uri: Uri = "/process.Process/Start".parse().unwrap();
        let t = classify(&heads(&[("E2b-Sandbox-Id", id.as_str())]), &uri, None).unwrap();
        assert_eq!(
            t,
            Target::Sandbox {
                id: id.clone(),
                port: ENVD_PORT
            }
        );
        let t = classify(
            &heads(&[
                ("e2b-sandbox-id", id.as_str()),
                ("E2b-Sandbox-Port", "8000"),
            ]),
            &uri,
            None,
        )
        .unwrap();
        assert_eq!(
            t,
            Target::Sandbox {
                id: id.clone(),
                port: 8000
            }
        );
        for bad in ["0", "65536", "x", "", "-1", "123456"] {
            let e = classify(
                &heads(&[("e2b-sandbox-id", id.as_str()), ("e2b-sandbox-port", bad)]),
                &uri,
                None,
            );
            assert!(matches!(e, Err(E2bError::BadRequest(_))), "{bad}");
        }
        let e = classify(&heads(&[("e2b-sandbox-id", "../etc")]), &uri, None);
        assert!(matches!(e, Err(E2bError::NotFound(_))));
    }

    #[test]
    fn hosts_name_the_sandbox_under_the_domain_only() {
        let id = id();
        let host = format!("8000-{id}.sb.example:7443");
        let uri: Uri = "/index.html".parse().unwrap();
        let t = classify(&heads(&[("host", &host)]), &uri, Some("sb.example")).unwrap();
        assert_eq!(
            t,
            Target::Sandbox {
                id: id.clone(),
                port: 8000
            }
        );
        // Without --e2b-domain the host means nothing.
        assert_eq!(
            classify(&heads(&[("host", &host)]), &uri, None).unwrap(),
            Target::Control
        );
        assert_eq!(sandbox_host("8000-x.other.example", "sb.example"), None);
        assert_eq!(sandbox_host("a.8000-x.sb.example", "sb.example"), None);
        assert_eq!(sandbox_host("sb.example", "sb.example"), None);
        assert_eq!(sandbox_host("x-y.sb.example", "sb.example"), None);
        assert_eq!(
            sandbox_host("49983-n1-abc.sb.example.", "sb.example"),
            Some((49983, "n1-abc"))
        );
        assert_eq!(sandbox_host("[::1]:80", "sb.example"), None);
        assert_eq!(sandbox_host("80-x.sb.example", ""), None);
    }

    #[test]
    fn paths_split_warren_from_e2b() {
        let h = HeaderMap::new();
        for (p, t) in [
            ("/v1/sandboxes", Target::Native),
            ("/metrics", Target::Native),
            ("/run_code", Target::Native),
            ("/run_jupyter", Target::Native),
            ("/ui", Target::Native),
            ("/ui/app.js", Target::Native),
            ("/sandboxes", Target::Control),
            ("/v2/sandboxes", Target::Control),
            ("/templates", Target::Control),
            ("/v1x", Target::Control),
        ] {
            assert_eq!(
                classify(&h, &p.parse().unwrap(), Some("d")).unwrap(),
                t,
                "{p}"
            );
        }
    }
}
