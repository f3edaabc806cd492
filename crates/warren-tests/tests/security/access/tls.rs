//! TLS: a test CA made here (rcgen); HTTPS with tokens works, plain HTTP on the TLS port is
//! refused, an untrusted certificate is named as the problem, client certificates are
//! required when `--tls-client-ca` is set, and plain TCP off loopback is refused at start.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use warren_client::{Client, ClientError, CreateSandboxRequest, ExecRequest};

use crate::common::{bin_dir, image_store, should_skip, Daemon};
use crate::{auth_file, free_port, TOKEN_A};

/// A CA: its certificate (PEM) and what signs with it.
pub(crate) struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        Ca {
            cert: p.self_signed(&key).unwrap(),
            key,
        }
    }

    /// Writes `<name>.pem` and `<name>.key` signed by this CA into `dir`.
    pub(crate) fn issue(&self, dir: &Path, name: &str, server: bool) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        if server {
            p.subject_alt_names = vec![
                SanType::DnsName("localhost".try_into().unwrap()),
                SanType::IpAddress("127.0.0.1".parse().unwrap()),
            ];
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        } else {
            p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }

    pub(crate) fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(format!("{name}.pem"));
        std::fs::write(&p, self.cert.pem()).unwrap();
        p
    }
}

/// A daemon serving TLS on a loopback port (and tokens); with `client_ca`, client
/// certificates signed by a second CA are required. Answers the daemon, the port and the
/// directory holding `ca.pem` (and `client.pem`/`client.key`).
async fn tls_daemon(client_ca: bool) -> Option<(Daemon, u16, PathBuf)> {
    let port = free_port();
    let d = Daemon::start_with(move |dir: &Path| {
        let ca = Ca::new("warren test CA");
        ca.write(dir, "ca");
        let (cert, key) = ca.issue(dir, "server", true);
        let auth = dir.join("auth.toml");
        std::fs::write(&auth, auth_file("")).unwrap();
        let mut args = vec![
            "--listen".to_string(),
            format!("127.0.0.1:{port}"),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--auth".into(),
            auth.display().to_string(),
        ];
        if client_ca {
            let clients = Ca::new("warren gateway CA");
            let path = clients.write(dir, "client-ca");
            clients.issue(dir, "client", false);
            // A certificate from a CA the node does not trust.
            Ca::new("someone else").issue(dir, "stranger", false);
            args.extend(["--tls-client-ca".to_string(), path.display().to_string()]);
        }
        args
    })
    .await?;
    let dir = d.dir.clone();
    Some((d, port, dir))
}

fn https(port: u16, ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Client {
    let mut b = Client::builder()
        .url(format!("https://127.0.0.1:{port}"))
        .token(TOKEN_A)
        .request_timeout(Some(crate::common::CALL_TIMEOUT));
    if let Some(ca) = ca {
        b = b.ca_file(ca);
    }
    if let Some((c, k)) = identity {
        b = b.client_identity(c, k);
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_token_works_and_plain_http_is_refused() {
    let Some((d, port, dir)) = tls_daemon(false).await else {
        return;
    };
    let ca = dir.join("ca.pem");
    let c = https(port, Some(&ca), None);
    let id = c.create(&CreateSandboxRequest::default()).await.unwrap().id;
    let r = c
        .exec(&id, &ExecRequest::shell("echo over tls"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "over tls\n");
    // The name in the URL must be one the certificate lists: localhost works too.
    let by_name = Client::builder()
        .url(format!("https://localhost:{port}"))
        .token(TOKEN_A)
        .ca_file(&ca)
        .build()
        .unwrap();
    by_name.get(&id).await.unwrap();
    // A terminal over TLS.
    let mut pty = c.pty(&id, "echo pty-ok", 80, 24).await.unwrap();
    let mut seen = String::new();
    while let Some(ev) = pty.next_event().await.unwrap() {
        match ev {
            warren_client::PtyEvent::Output(b) => seen.push_str(&String::from_utf8_lossy(&b)),
            warren_client::PtyEvent::Exit { .. } => break,
        }
    }
    assert!(seen.contains("pty-ok"), "{seen:?}");

    // Plain HTTP to the TLS port gets no answer from the API.
    let plain = crate::tcp(port, Some(TOKEN_A));
    let e = plain
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap_err();
    assert!(e.code().is_none(), "plain HTTP reached the API: {e}");
    assert_eq!(
        d.list().await.len(),
        1,
        "nothing was created over plain HTTP"
    );

    // Without the test CA the certificate is untrusted, and the error says so.
    let e = https(port, None, None).get(&id).await.unwrap_err();
    match &e {
        ClientError::Tls { url, reason } => {
            assert!(url.contains(&port.to_string()), "{url}");
            assert!(reason.contains("not signed by a trusted CA"), "{reason}");
        }
        other => panic!("expected a TLS error, got {other:?}"),
    }
    // A wrong token over TLS is a 401 like anywhere else.
    let wrong = Client::builder()
        .url(format!("https://127.0.0.1:{port}"))
        .token("nope")
        .ca_file(&ca)
        .build()
        .unwrap();
    assert!(wrong.get(&id).await.unwrap_err().is_unauthorized());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_required_when_configured() {
    let Some((d, port, dir)) = tls_daemon(true).await else {
        return;
    };
    let ca = dir.join("ca.pem");
    let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
    let ok = https(port, Some(&ca), Some((&cert, &key)));
    let id = ok
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap()
        .id;
    // No certificate, or one from an untrusted CA: refused before any HTTP.
    let none = https(port, Some(&ca), None);
    let e = none.get(&id).await.unwrap_err();
    assert!(
        e.code().is_none(),
        "answered without a client certificate: {e}"
    );
    let (sc, sk) = (dir.join("stranger.pem"), dir.join("stranger.key"));
    let stranger = https(port, Some(&ca), Some((&sc, &sk)));
    let e = stranger.get(&id).await.unwrap_err();
    assert!(e.code().is_none(), "answered a stranger's certificate: {e}");
    assert_eq!(d.list().await.len(), 1);
    ok.delete(&id).await.unwrap();
}

#[test]
fn plain_tcp_off_loopback_is_refused_at_start() {
    if should_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(bin_dir().join("warrend"))
        .arg("--socket")
        .arg(dir.path().join("w.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--image-store")
        .arg(image_store())
        .args(["--node", "tlsrefuse", "--listen"])
        .arg(format!("0.0.0.0:{}", free_port()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("only on loopback"), "{err}");
    assert!(!dir.path().join("w.sock").exists());
    assert!(!dir.path().join("state").exists(), "nothing was started");
}
