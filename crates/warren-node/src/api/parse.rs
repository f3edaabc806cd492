//! One entry point over everything the edge parses from a request before a handler runs:
//! the Content-Type check, the JSON body of a route into its typed request and that type's
//! validation, the query string and the `path` parameter, the sandbox id and pid path
//! parameters — each with the same code the routes use. The fuzz target (`fuzz/`) and the
//! property test below drive it with arbitrary input; it must answer `Ok` or a typed error,
//! never panic.

use axum::http::{HeaderMap, HeaderValue};
use warren_types::sandbox::LimitBounds;
use warren_types::{
    ChmodRequest, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, Limits, MkdirRequest,
};

use super::extract::{check_content_type, parse_json, pid as parse_pid, sandbox_id, QueryPairs};

/// Which route's JSON body a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// `POST /v1/sandboxes`.
    Create,
    /// `POST /v1/sandboxes/{id}/exec` (and `/exec/stream`, `/processes`).
    Exec,
    /// `POST /v1/sandboxes/{id}/fork`.
    Fork,
    /// `POST /v1/sandboxes/{id}/files/mkdir`.
    Mkdir,
    /// `POST /v1/sandboxes/{id}/files/chmod`.
    Chmod,
}

impl Body {
    /// Every body the API parses.
    pub const ALL: [Body; 5] = [
        Body::Create,
        Body::Exec,
        Body::Fork,
        Body::Mkdir,
        Body::Chmod,
    ];

    /// Parses and validates `body` as this route does.
    fn parse(self, body: &[u8]) -> Result<(), ErrorCode> {
        let code = |e: super::HttpError| e.error.code;
        match self {
            Body::Create => parse_json::<CreateSandboxRequest>(body)
                .map_err(code)?
                .validate(&Limits::default(), &LimitBounds::default())
                .map(|_| ())
                .map_err(|e| e.code),
            Body::Exec => parse_json::<ExecRequest>(body)
                .map_err(code)?
                .validate()
                .map_err(|e| e.code),
            Body::Fork => parse_json::<ForkRequest>(body)
                .map_err(code)?
                .validate()
                .map_err(|e| e.code),
            Body::Mkdir => parse_json::<MkdirRequest>(body).map(|_| ()).map_err(code),
            Body::Chmod => parse_json::<ChmodRequest>(body).map(|_| ()).map_err(code),
        }
    }
}

/// What the edge made of one request whose body is `kind`'s; `Err` carries the stable code
/// it would answer.
pub fn parse_any(
    content_type: &[u8],
    query: &[u8],
    id: &str,
    pid: &str,
    kind: Body,
    body: &[u8],
) -> Result<(), ErrorCode> {
    let code = |e: super::HttpError| e.error.code;
    let mut headers = HeaderMap::new();
    if !content_type.is_empty() {
        let v = HeaderValue::from_bytes(content_type).map_err(|_| ErrorCode::InvalidRequest)?;
        headers.insert(axum::http::header::CONTENT_TYPE, v);
    }
    check_content_type(&headers).map_err(code)?;
    let q = QueryPairs::from_query(query);
    if let Some(p) = q.get("path") {
        warren_types::validate::sandbox_path(p).map_err(|e| e.code)?;
    }
    q.only(&["path", "mode", "step", "recursive", "parents"], &[])
        .map_err(code)?;
    let _ = q.flag("recursive").map_err(code)?;
    let _ = q.index("step", "a step").map_err(code)?;
    sandbox_id(id).map_err(code)?;
    parse_pid(pid).map_err(code)?;
    kind.parse(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift64*), so every run checks the same cases.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        fn bytes(&mut self, max: usize) -> Vec<u8> {
            let n = self.below(max);
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    const SEEDS: &[(Body, &str)] = &[
        (
            Body::Create,
            r#"{"image":"default","cpus":1.5,"memory_mb":256,"cpu_class":"best_effort","labels":{"a":"b"}}"#,
        ),
        (
            Body::Exec,
            r#"{"argv":["python3","-c","print(1)"],"env":{"A":"1"},"timeout_secs":5,"max_output_bytes":1024}"#,
        ),
        (
            Body::Exec,
            r#"{"shell":"echo hi","stdin":"x","user":"1000:1000","cwd":"/tmp","step":3}"#,
        ),
        (Body::Fork, r#"{"n":4,"labels":{"k":"v"}}"#),
        (
            Body::Mkdir,
            r#"{"path":"/tmp/a","parents":true,"mode":493}"#,
        ),
        (Body::Chmod, r#"{"path":"/tmp/a","mode":420}"#),
    ];
    const TOKENS: &[&str] = &[
        "{",
        "}",
        "[",
        "]",
        ",",
        ":",
        "\"",
        "\\u0000",
        "\\ud800",
        "1e308",
        "-1",
        "null",
        "true",
        "18446744073709551616",
        "\"../..\"",
        "\"/\\u0000\"",
        "\u{feff}",
        "\u{10ffff}",
        "[[[[[[[[",
        "\"cpu_class\":\"x\"",
    ];

    fn mutate(r: &mut Rng, seed: &str) -> Vec<u8> {
        let mut v = seed.as_bytes().to_vec();
        for _ in 0..=r.below(4) {
            let at = r.below(v.len() + 1);
            match r.below(4) {
                0 => {
                    let t = TOKENS[r.below(TOKENS.len())];
                    v.splice(at..at, t.bytes());
                }
                1 if !v.is_empty() => {
                    let end = (at + r.below(8)).min(v.len());
                    v.drain(at.min(end)..end);
                }
                2 if at < v.len() => v[at] = r.next() as u8,
                _ => {
                    let b = r.bytes(6);
                    v.splice(at..at, b);
                }
            }
        }
        v
    }

    #[test]
    fn arbitrary_requests_get_typed_answers() {
        let mut r = Rng(0x005e_ed0f_3a77_e2e7);
        let ids = [
            "n1-01jd0m7x4e8k0k9yq1w2e3r4t5",
            "",
            "..",
            "n1-\u{0}",
            "x".repeat(300).leak(),
        ];
        let cts: [&[u8]; 5] = [
            b"",
            b"application/json",
            b"text/plain",
            b"application/x+json; q=\xff",
            b"\x00",
        ];
        let mut ok = 0;
        for i in 0..4000 {
            let (kind, body) = if i % 5 == 0 {
                (Body::ALL[r.below(Body::ALL.len())], r.bytes(256))
            } else {
                let (kind, seed) = SEEDS[r.below(SEEDS.len())];
                (kind, mutate(&mut r, seed))
            };
            let query = if i % 3 == 0 {
                r.bytes(64)
            } else {
                format!(
                    "path={}&step={}",
                    ["/tmp/x", "%2F..%2F..", "%00", "/a/../../b"][r.below(4)],
                    r.next() % 7
                )
                .into_bytes()
            };
            let id = ids[r.below(ids.len())];
            let ct = cts[r.below(cts.len())];
            let res = std::panic::catch_unwind(|| parse_any(ct, &query, id, "12", kind, &body));
            match res {
                Ok(Ok(())) => ok += 1,
                Ok(Err(code)) => assert!(
                    matches!(code, ErrorCode::InvalidRequest | ErrorCode::InvalidPath),
                    "case {i}: unexpected code {code:?}"
                ),
                Err(_) => panic!(
                    "case {i} panicked: ct={ct:?} query={:?} id={id:?} body={:?}",
                    String::from_utf8_lossy(&query),
                    String::from_utf8_lossy(&body)
                ),
            }
        }
        // The generator also reaches the accepting paths, not only refusals.
        assert!(ok > 0, "no generated request was accepted");
    }

    const ID: &str = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5";

    #[test]
    fn known_requests_parse() {
        for (kind, s) in SEEDS {
            let ok = parse_any(
                b"application/json",
                b"path=/tmp/x",
                ID,
                "1",
                *kind,
                s.as_bytes(),
            );
            assert_eq!(ok, Ok(()), "{s}");
        }
        assert_eq!(
            parse_any(b"", b"path=%2F..%2F..", ID, "1", Body::Create, b"{}"),
            Err(ErrorCode::InvalidPath)
        );
    }

    #[test]
    fn a_body_is_held_to_its_own_route() {
        // A valid mkdir body is not a valid exec body, and the other way round.
        let mkdir = br#"{"path":"/tmp/a","parents":true}"#;
        assert_eq!(parse_any(b"", b"", ID, "1", Body::Mkdir, mkdir), Ok(()));
        assert_eq!(
            parse_any(b"", b"", ID, "1", Body::Exec, mkdir),
            Err(ErrorCode::InvalidRequest)
        );
        let exec = br#"{"argv":["true"]}"#;
        assert_eq!(
            parse_any(b"", b"", ID, "1", Body::Mkdir, exec),
            Err(ErrorCode::InvalidRequest)
        );
    }

    #[test]
    fn pids_are_checked_as_the_routes_check_them() {
        let body = br#"{"argv":["true"]}"#;
        for bad in ["0", "-1", "x", "", "4294967296"] {
            assert_eq!(
                parse_any(b"", b"", ID, bad, Body::Exec, body),
                Err(ErrorCode::InvalidRequest),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_any(b"", b"", ID, "4294967295", Body::Exec, body),
            Ok(())
        );
    }
}
