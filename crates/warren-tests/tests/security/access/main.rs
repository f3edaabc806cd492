//! Remote access: tokens, tenants, quotas and TLS, against real daemons (run as root).
//!
//! Each test starts its own `warrend` with an auth file written into the daemon's directory
//! and a TCP listener on a free loopback port; tenants' clients connect over TCP with their
//! tokens, while the test harness keeps its root client on the Unix socket (root there is the
//! node's administrator), which also deletes every sandbox when the daemon is dropped.

#[path = "../../common/mod.rs"]
mod common;
#[path = "../../common/etcd.rs"]
mod etcd;

mod gateway;
mod images;
mod quotas;
mod tenants;
mod tls;
mod tokens;

use std::path::Path;
use std::time::Duration;

use common::Daemon;
use warren_client::{Client, ClientError, ErrorCode};

/// Tokens of the tenants every test's auth file knows.
pub const TOKEN_A: &str = "token-of-team-a-0123456789";
pub const TOKEN_B: &str = "token-of-team-b-0123456789";
pub const TOKEN_OPS: &str = "token-of-ops-0123456789";

/// The sha256 of a token in hex, as the auth file wants it.
pub fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// An auth file with tenants `team-a` and `team-b` (users), `ops` (admin), plus `extra`.
pub fn auth_file(extra: &str) -> String {
    format!(
        "[[tenant]]\nname = \"team-a\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n\n\
         [[tenant]]\nname = \"team-b\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n\n\
         [[tenant]]\nname = \"ops\"\nrole = \"admin\"\ntoken_sha256 = [\"{}\"]\n\n{extra}",
        sha(TOKEN_A),
        sha(TOKEN_B),
        sha(TOKEN_OPS)
    )
}

/// A free TCP port on loopback (bound and released; the daemon binds it next).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A daemon with `auth` as its auth file and plain HTTP on a loopback port, plus `more`
/// arguments; answers the daemon and the port.
pub async fn daemon(auth: &str, more: &[String]) -> Option<(Daemon, u16)> {
    let port = free_port();
    let auth = auth.to_string();
    let more = more.to_vec();
    let d = Daemon::start_with(move |dir: &Path| {
        let file = dir.join("auth.toml");
        std::fs::write(&file, auth).unwrap();
        let mut args = vec![
            "--auth".to_string(),
            file.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
        ];
        args.extend(more);
        args
    })
    .await?;
    Some((d, port))
}

/// A client of `url` with `token`, bounded like the harness's.
pub fn client(url: &str, token: Option<&str>) -> Client {
    let mut b = Client::builder()
        .url(url)
        .request_timeout(Some(common::CALL_TIMEOUT));
    if let Some(t) = token {
        b = b.token(t);
    }
    b.build().unwrap()
}

/// A client of the daemon's loopback port.
pub fn tcp(port: u16, token: Option<&str>) -> Client {
    client(&format!("http://127.0.0.1:{port}"), token)
}

/// The API error code of a result, panicking on success.
pub fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e
            .code()
            .unwrap_or_else(|| panic!("expected an API error, got {e}")),
    }
}

/// The longest a test waits for something asynchronous to show.
pub const WAIT: Duration = Duration::from_secs(30);
