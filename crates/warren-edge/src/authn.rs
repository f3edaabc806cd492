//! The authentication middleware: every request presents `Authorization: Bearer <token>`;
//! the token's tenant and role become a [`Caller`] in the request's extensions, where the
//! handlers find it. The auth file behind it can be swapped at any time (SIGHUP) without
//! touching open connections: requests already authenticated keep their caller.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use warren_types::{ApiError, Caller, ErrorBody, ErrorCode};

use crate::auth_file::AuthFile;
use crate::error::EdgeError;
use crate::serve::Peer;
use crate::throttle::{Source, Throttle};

/// Who may call. Without an auth file every request acts as the node's administrator
/// (the behaviour of a node without `--auth`).
#[derive(Debug)]
pub struct Authenticator {
    path: Option<PathBuf>,
    file: RwLock<Option<Arc<AuthFile>>>,
    throttle: Throttle,
    /// Unix-socket peers running as root act as the administrator without a token (they
    /// own the host anyway).
    pub root_on_unix_is_admin: bool,
}

impl Authenticator {
    /// No authentication: every caller is the administrator.
    pub fn open() -> Authenticator {
        Authenticator {
            path: None,
            file: RwLock::new(None),
            throttle: Throttle::default(),
            root_on_unix_is_admin: true,
        }
    }

    /// Tokens from `path`, read now and again on each [`Authenticator::reload`].
    pub fn from_file(path: PathBuf) -> Result<Authenticator, EdgeError> {
        let file = AuthFile::load(&path)?;
        Ok(Authenticator {
            path: Some(path),
            file: RwLock::new(Some(Arc::new(file))),
            throttle: Throttle::default(),
            root_on_unix_is_admin: true,
        })
    }

    /// Tokens from an already parsed file (tests, embedders); never reloaded.
    pub fn from_parsed(file: AuthFile) -> Authenticator {
        Authenticator {
            path: None,
            file: RwLock::new(Some(Arc::new(file))),
            throttle: Throttle::default(),
            root_on_unix_is_admin: true,
        }
    }

    /// Whether requests must present a token.
    pub fn enabled(&self) -> bool {
        self.current().is_some()
    }

    fn current(&self) -> Option<Arc<AuthFile>> {
        self.file.read().expect("auth file lock").clone()
    }

    /// Reads the auth file again. A file that fails to parse is refused and the tokens in
    /// force stay (a typo must not lock everybody out or let everybody in). Answers how many
    /// tenants are now known.
    pub fn reload(&self) -> Result<usize, EdgeError> {
        let Some(path) = &self.path else {
            return Ok(0);
        };
        let file = AuthFile::load(path)?;
        let n = file.tenants().len();
        *self.file.write().expect("auth file lock") = Some(Arc::new(file));
        Ok(n)
    }

    /// Decides who `req` acts as, or why it may not act at all.
    pub fn caller(&self, peer: Option<&Peer>, authorization: Option<&HeaderValue>) -> Verdict {
        let Some(file) = self.current() else {
            return Verdict::Caller(Caller::admin());
        };
        let Some(value) = authorization else {
            if self.root_on_unix_is_admin && matches!(peer, Some(Peer::Unix { uid: Some(0) })) {
                return Verdict::Caller(Caller::admin());
            }
            return Verdict::Missing;
        };
        let token = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty());
        let source = peer.map(Peer::source).unwrap_or(Source::Unknown);
        match token.and_then(|t| file.authenticate(t)) {
            Some(c) => {
                self.throttle
                    .succeed(source, c.tenant.as_deref(), Instant::now());
                Verdict::Caller(c)
            }
            None => Verdict::Refused(self.throttle.fail(source, token, Instant::now())),
        }
    }
}

/// The outcome of authenticating one request.
#[derive(Debug)]
pub enum Verdict {
    Caller(Caller),
    /// No `Authorization` header.
    Missing,
    /// A bad token; answer after this delay.
    Refused(std::time::Duration),
}

/// The `401` answer: a JSON error body and `WWW-Authenticate: Bearer`.
pub fn unauthorized(message: &str) -> Response {
    let body = ErrorBody {
        error: ApiError::new(ErrorCode::Unauthorized, message),
    };
    let mut resp = (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"warren\""),
    );
    resp
}

/// The axum middleware (`axum::middleware::from_fn_with_state(auth, authenticate)`).
pub async fn authenticate(
    State(auth): State<Arc<Authenticator>>,
    mut req: Request<Body>,
    next: Next,
) -> Response {
    let peer = req.extensions().get::<Peer>().cloned();
    match auth.caller(peer.as_ref(), req.headers().get(header::AUTHORIZATION)) {
        Verdict::Caller(c) => {
            req.extensions_mut().insert(c);
            next.run(req).await
        }
        Verdict::Missing => unauthorized(
            "a token is required: send Authorization: Bearer <token> (WARREN_TOKEN for the CLI and SDK)",
        ),
        Verdict::Refused(delay) => {
            // Rate-limited: a flood of bad tokens must not flood the log.
            if let Some(quiet) = auth.throttle.log_refusal(Instant::now()) {
                tracing::warn!(
                    peer = ?peer, delay_ms = delay.as_millis() as u64, not_logged = quiet,
                    "refused a bad token"
                );
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            unauthorized("the token is not valid (unknown, revoked or mistyped)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth_file::token_sha256;
    use crate::throttle::FREE_FAILURES;

    fn auth() -> Authenticator {
        let text = format!(
            "[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n",
            token_sha256("good")
        );
        Authenticator::from_parsed(AuthFile::parse(&text).unwrap())
    }

    fn bearer(t: &str) -> HeaderValue {
        HeaderValue::from_str(&format!("Bearer {t}")).unwrap()
    }

    #[test]
    fn tokens_decide_the_caller() {
        let a = auth();
        let tcp = Peer::Tcp("192.0.2.7:4000".parse().unwrap());
        match a.caller(Some(&tcp), Some(&bearer("good"))) {
            Verdict::Caller(c) => assert_eq!(c.tenant.as_deref(), Some("a")),
            v => panic!("{v:?}"),
        }
        match a.caller(
            Some(&tcp),
            Some(&HeaderValue::from_static("bearer   good  ")),
        ) {
            Verdict::Caller(_) => {}
            v => panic!("{v:?}"),
        }
        assert!(matches!(a.caller(Some(&tcp), None), Verdict::Missing));
        for bad in ["Bearer bad", "Basic Z29vZA==", "Bearer", "good"] {
            let v = a.caller(Some(&tcp), Some(&HeaderValue::from_static(bad)));
            assert!(matches!(v, Verdict::Refused(_)), "{bad}: {v:?}");
        }
        // Root on the Unix socket needs no token; other users do.
        let root = Peer::Unix { uid: Some(0) };
        assert!(matches!(a.caller(Some(&root), None), Verdict::Caller(c) if c.is_admin()));
        let user = Peer::Unix { uid: Some(1000) };
        assert!(matches!(a.caller(Some(&user), None), Verdict::Missing));
        // Root presenting a token acts as that token's tenant.
        assert!(
            matches!(a.caller(Some(&root), Some(&bearer("good"))), Verdict::Caller(c) if !c.is_admin())
        );
    }

    #[test]
    fn repeated_failures_are_slowed_and_a_success_forgives_nothing() {
        let a = auth();
        let peer = Peer::Tcp("192.0.2.9:1".parse().unwrap());
        let mut delays = Vec::new();
        for i in 0..FREE_FAILURES + 2 {
            match a.caller(Some(&peer), Some(&bearer(&format!("{i}-wrong")))) {
                Verdict::Refused(d) => delays.push(d),
                v => panic!("{v:?}"),
            }
        }
        assert!(delays[..FREE_FAILURES as usize].iter().all(|d| d.is_zero()));
        assert!(delays[FREE_FAILURES as usize] > std::time::Duration::ZERO);
        assert!(delays[FREE_FAILURES as usize + 1] > delays[FREE_FAILURES as usize]);
        // Same address, another port: the same source.
        let again = Peer::Tcp("192.0.2.9:2".parse().unwrap());
        assert!(
            matches!(a.caller(Some(&again), Some(&bearer("x"))), Verdict::Refused(d) if !d.is_zero())
        );
        // A good token is answered at once, and forgives nothing.
        assert!(matches!(
            a.caller(Some(&again), Some(&bearer("good"))),
            Verdict::Caller(_)
        ));
        assert!(
            matches!(a.caller(Some(&again), Some(&bearer("y"))), Verdict::Refused(d) if !d.is_zero())
        );
        // Its tenant's later guesses from a fresh address count with the earlier ones.
        let fresh = Peer::Tcp("203.0.113.5:1".parse().unwrap());
        assert!(matches!(
            a.caller(Some(&fresh), Some(&bearer("good"))),
            Verdict::Caller(_)
        ));
        assert!(matches!(
            a.caller(Some(&fresh), Some(&bearer("z"))),
            Verdict::Refused(_)
        ));
        assert_eq!(a.throttle.tenant_failures("a"), 2);
    }

    #[test]
    fn without_a_file_everyone_is_admin() {
        let a = Authenticator::open();
        assert!(!a.enabled());
        assert!(
            matches!(a.caller(None, None), Verdict::Caller(c) if c.is_admin() && c.tenant.is_none())
        );
    }

    #[test]
    fn a_broken_reload_keeps_the_tokens_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("auth.toml");
        let write = |tok: &str| {
            std::fs::write(
                &p,
                format!(
                    "[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n",
                    token_sha256(tok)
                ),
            )
            .unwrap()
        };
        write("old");
        let a = Authenticator::from_file(p.clone()).unwrap();
        assert!(matches!(
            a.caller(None, Some(&bearer("old"))),
            Verdict::Caller(_)
        ));
        write("new");
        assert_eq!(a.reload().unwrap(), 1);
        assert!(matches!(
            a.caller(None, Some(&bearer("old"))),
            Verdict::Refused(_)
        ));
        assert!(matches!(
            a.caller(None, Some(&bearer("new"))),
            Verdict::Caller(_)
        ));
        std::fs::write(&p, "garbage [").unwrap();
        assert!(a.reload().is_err());
        assert!(matches!(
            a.caller(None, Some(&bearer("new"))),
            Verdict::Caller(_)
        ));
    }
}
