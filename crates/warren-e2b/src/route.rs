//! Which way a request goes: to a sandbox (envd or another port), to E2B's control plane, or
//! to Warren's own API. Pure functions of the request's head, so they are tested and fuzzed
//! without a server.
//!
//! A request is for a sandbox when it carries `E2b-Sandbox-Id` (and `E2b-Sandbox-Port`,
//! default envd's port), as the SDKs send with `E2B_SANDBOX_URL` and on every envd call, or
//! when its host is `{port}-{sandbox id}.{domain}` with the server's `--e2b-domain`, as
//! `sandbox.get_host(port)` names it. Warren's routes (`/v1/…`, `/metrics`, `/ui`) keep
//! their meaning; every other path is E2B's control plane.

use axum::http::{header, HeaderMap, Uri};
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
                    .get(header::HOST)
                    .and_then(|h| h.to_str().ok())
                    .map(str::to_string)
            })
            .unwrap_or_default();
        // Host names are case-insensitive; sandbox ids are lowercase.
        let host = host.to_ascii_lowercase();
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

/// Names a sandbox port in the request's own headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`),
/// as a gateway does before it forwards a sandbox request to the sandbox's node: the `Host`
/// (`{port}-{id}.{domain}`) is not forwarded (it names the gateway, and the node may serve
/// another domain or none), the headers route the same on any node.
pub fn name_in_headers(headers: &mut HeaderMap, id: &SandboxId, port: u16) {
    use axum::http::HeaderValue;
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        headers.insert(SANDBOX_ID_HEADER, v);
    }
    headers.insert(SANDBOX_PORT_HEADER, HeaderValue::from(port));
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
    if id.is_empty() {
        return None;
    }
    Some((parse_port(port)?, id))
}

/// The user name of `Authorization: Basic base64(user:)`, as the SDKs name the user of an
/// envd call.
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let user = text.split(':').next()?.to_string();
    (!user.is_empty()).then_some(user)
}

/// The per-sandbox control routes (`/sandboxes/{id}/…`, `/v2/sandboxes/{id}/…`): the id.
pub fn control_sandbox(path: &str) -> Option<&str> {
    let rest = path
        .strip_prefix("/v2/sandboxes/")
        .or_else(|| path.strip_prefix("/sandboxes/"))?;
    let id = rest.split('/').next()?;
    // `/sandboxes/metrics` names no sandbox.
    (!id.is_empty() && id != "metrics").then_some(id)
}

/// One fuzz input through everything that reads a request's head before it is answered:
/// [`classify`], [`sandbox_host`], [`control_sandbox`], [`basic_user`]. The input is split at
/// `0xff` bytes into the `--e2b-domain`, the `Host`, `E2b-Sandbox-Id`, `E2b-Sandbox-Port` and
/// `Authorization` headers and the request target. Never panics; an error is answered in
/// E2B's shape. Used by the `e2b_route` fuzz target and the seeded property test.
pub fn fuzz_one(data: &[u8]) {
    use axum::http::HeaderValue;
    use axum::response::IntoResponse;
    let mut parts = data.split(|b| *b == 0xff);
    let mut next = move || parts.next().unwrap_or(&[]);
    let domain = String::from_utf8_lossy(next()).into_owned();
    let host = next();
    let mut headers = HeaderMap::new();
    for (name, v) in [
        (header::HOST, host),
        (header::HeaderName::from_static(SANDBOX_ID_HEADER), next()),
        (header::HeaderName::from_static(SANDBOX_PORT_HEADER), next()),
        (header::AUTHORIZATION, next()),
    ] {
        if let (false, Ok(v)) = (v.is_empty(), HeaderValue::from_bytes(v)) {
            headers.insert(name, v);
        }
    }
    let uri = std::str::from_utf8(next())
        .ok()
        .and_then(|s| s.parse::<Uri>().ok())
        .unwrap_or_else(|| Uri::from_static("/"));
    let domain = (!domain.is_empty()).then_some(domain.as_str());
    match classify(&headers, &uri, domain) {
        Ok(Target::Sandbox { port, .. }) => assert!(port > 0),
        Ok(Target::Control | Target::Native) => {}
        Err(e) => {
            let _ = e.into_response();
        }
    }
    if let Some(d) = domain {
        if let Some((port, id)) = sandbox_host(&String::from_utf8_lossy(host), d) {
            assert!(port > 0 && !id.contains('.'));
        }
    }
    let _ = control_sandbox(uri.path());
    let _ = basic_user(&headers);
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

    #[test]
    fn malformed_hosts_are_not_sandboxes() {
        let d = "sb.example";
        for bad in [
            "",
            ".",
            "sb.example",
            ".sb.example",
            "-.sb.example",
            "8000-.sb.example",
            "-n1-x.sb.example",
            "0-n1-x.sb.example",
            "65536-n1-x.sb.example",
            "123456-n1-x.sb.example",
            "+80-n1-x.sb.example",
            " 80-n1-x.sb.example",
            "80 -n1-x.sb.example",
            "80-n1-x.sb.example.evil",
            "80-n1-x.xsb.example",
            "80-n1-x.sb.examplex",
            "80-n1-xsb.example",
            "80-n1-x..sb.example",
            "a.80-n1-x.sb.example",
            "[80-n1-x.sb.example]",
            "80-n1-x.sb.example:80:80",
            "ünï-80.sb.example",
        ] {
            assert_eq!(sandbox_host(bad, d), None, "{bad:?}");
        }
        // A port suffix (any digits, even none) and one trailing dot are fine.
        assert_eq!(sandbox_host("80-n1-x.sb.example:", d), Some((80, "n1-x")));
        assert_eq!(
            sandbox_host("80-n1-x.sb.example:7443", d),
            Some((80, "n1-x"))
        );
        assert_eq!(sandbox_host("80-n1-x.sb.example.", d), Some((80, "n1-x")));
        // The domain is matched whole, with or without dots around it.
        assert_eq!(
            sandbox_host("80-n1-x.sb.example", ".sb.example."),
            Some((80, "n1-x"))
        );
        assert_eq!(sandbox_host("80-n1-x.sb.example", "."), None);
    }

    #[test]
    fn hosts_are_case_insensitive() {
        let id = id();
        let host = format!("8000-{}.SB.Example", id.as_str().to_ascii_uppercase());
        let uri: Uri = "/".parse().unwrap();
        let t = classify(&heads(&[("host", &host)]), &uri, Some("sb.example")).unwrap();
        assert_eq!(t, Target::Sandbox { id, port: 8000 });
    }

    #[test]
    fn malformed_headers_are_e2b_errors() {
        let id = id();
        let uri: Uri = "/".parse().unwrap();
        // Not text: 400.
        let mut h = HeaderMap::new();
        h.insert(
            SANDBOX_ID_HEADER,
            HeaderValue::from_bytes(b"n1-\xff\xfe").unwrap(),
        );
        assert!(matches!(
            classify(&h, &uri, None),
            Err(E2bError::BadRequest(_))
        ));
        let mut h = heads(&[(SANDBOX_ID_HEADER, id.as_str())]);
        h.insert(
            SANDBOX_PORT_HEADER,
            HeaderValue::from_bytes(b"8\xff").unwrap(),
        );
        assert!(matches!(
            classify(&h, &uri, None),
            Err(E2bError::BadRequest(_))
        ));
        // Ids that are not sandbox ids: 404, whatever they hold.
        for bad in [
            "",
            " ",
            "n1",
            "N1-01hzzzzzzzzzzzzzzzzzzzzzzz",
            "n1-../../x",
            "n1-01hz",
        ] {
            let e = classify(&heads(&[(SANDBOX_ID_HEADER, bad)]), &uri, None);
            assert!(matches!(e, Err(E2bError::NotFound(_))), "{bad:?}");
        }
        // Whitespace around the values is ignored.
        let t = classify(
            &heads(&[
                (SANDBOX_ID_HEADER, &format!(" {id} ")),
                (SANDBOX_PORT_HEADER, " 8000 "),
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
        // The headers win over the host.
        let t = classify(
            &heads(&[
                (SANDBOX_ID_HEADER, id.as_str()),
                ("host", "9-n1-whatever.sb.example"),
            ]),
            &uri,
            Some("sb.example"),
        )
        .unwrap();
        assert_eq!(
            t,
            Target::Sandbox {
                id,
                port: ENVD_PORT
            }
        );
        // A host under the domain whose id is not one: 404.
        let e = classify(
            &heads(&[("host", "80-nope.sb.example")]),
            &uri,
            Some("sb.example"),
        );
        assert!(matches!(e, Err(E2bError::NotFound(_))));
    }

    #[test]
    fn an_absolute_request_target_names_the_host() {
        let id = id();
        let uri: Uri = format!("http://80-{id}.sb.example/x").parse().unwrap();
        let t = classify(&heads(&[("host", "elsewhere")]), &uri, Some("sb.example")).unwrap();
        assert_eq!(t, Target::Sandbox { id, port: 80 });
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic cm9vdDo="),
        );
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        for bad in [
            "Basic !!",
            "Bearer x",
            "Basic",
            "Basic Og==",
            "basic",
            "Basic /w==",
        ] {
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(bad));
            assert_eq!(basic_user(&h), None, "{bad}");
        }
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bAsIc   dXNlcjpwYXNz "),
        );
        assert_eq!(basic_user(&h).as_deref(), Some("user"));
    }

    #[test]
    fn control_routes_name_their_sandbox() {
        assert_eq!(control_sandbox("/sandboxes/n1-x/pause"), Some("n1-x"));
        assert_eq!(control_sandbox("/v2/sandboxes/n1-x/connect"), Some("n1-x"));
        assert_eq!(control_sandbox("/sandboxes/n1-x"), Some("n1-x"));
        assert_eq!(control_sandbox("/sandboxes"), None);
        assert_eq!(control_sandbox("/sandboxes/"), None);
        assert_eq!(control_sandbox("/sandboxes//x"), None);
        assert_eq!(control_sandbox("/sandboxes/metrics"), None);
        assert_eq!(control_sandbox("/v3/sandboxes/n1-x"), None);
    }

    /// A small deterministic generator (xorshift), so the property test needs no crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// The fuzz target's entry point over mutations of the seeds (fuzz/seeds/e2b_route).
    #[test]
    fn fuzz_one_never_panics_on_mutated_requests() {
        let seeds: &[&[u8]] = &[
            include_bytes!("../../../fuzz/seeds/e2b_route/host"),
            include_bytes!("../../../fuzz/seeds/e2b_route/headers"),
            include_bytes!("../../../fuzz/seeds/e2b_route/control"),
        ];
        let alphabet = b"0123456789-.:/ []@%abcxyzABC\xff\x00\x7f\xc3\xa9";
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for i in 0..4000 {
            let mut b = seeds[i % seeds.len()].to_vec();
            for _ in 0..=rng.below(8) {
                let at = rng.below(b.len() + 1);
                match rng.below(3) {
                    0 if at < b.len() => {
                        b.remove(at);
                    }
                    1 if at < b.len() => b[at] = alphabet[rng.below(alphabet.len())],
                    _ => b.insert(at, alphabet[rng.below(alphabet.len())]),
                }
            }
            super::fuzz_one(&b);
        }
        for s in seeds {
            super::fuzz_one(s);
        }
        super::fuzz_one(b"");
        super::fuzz_one(&[0xff; 64]);
    }
}
