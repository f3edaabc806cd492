//! A cluster reached the way a remote trainer reaches it: a real 3-member etcd, a node that
//! serves only TLS and requires client certificates, and a gateway that serves TLS with
//! tokens and presents its own certificate to the node. Tokens pass through the gateway and
//! the node decides what a tenant sees; the gateway's own routes need a token, and drain
//! needs an administrator, as does the cluster view.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use warren_client::{Client, CreateSandboxRequest, ErrorCode, ExecRequest};

use crate::common::{bin_dir, should_skip, test_root, Daemon, CALL_TIMEOUT};
use crate::etcd::EtcdCluster;
use crate::tls::Ca;
use crate::{auth_file, code, free_port, TOKEN_A, TOKEN_B, TOKEN_OPS};

/// A `warren-gateway` child, stopped on drop.
struct Gw(Child, PathBuf);

impl Drop for Gw {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        if std::thread::panicking() {
            eprintln!(
                "gateway log:\n{}",
                std::fs::read_to_string(&self.1).unwrap_or_default()
            );
        }
    }
}

fn https(port: u16, ca: &Path, token: Option<&str>) -> Client {
    let mut b = Client::builder()
        .url(format!("https://127.0.0.1:{port}"))
        .ca_file(ca)
        .request_timeout(Some(CALL_TIMEOUT));
    if let Some(t) = token {
        b = b.token(t);
    }
    b.build().unwrap()
}

fn arg(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_gateway_with_tokens_in_front_of_a_node_requiring_client_certificates() {
    if should_skip() {
        return;
    }
    let gw_bin = bin_dir().join("warren-gateway");
    assert!(
        gw_bin.is_file(),
        "{} is missing; build it with `cargo build --release --workspace --bins`",
        gw_bin.display()
    );
    let dir = test_root().join(format!("secure-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("warren cluster CA");
    let ca_pem = ca.write(&dir, "ca");
    let (node_cert, node_key) = ca.issue(&dir, "node", true);
    let (gw_cert, gw_key) = ca.issue(&dir, "gateway", true);
    let (gw_client, gw_client_key) = ca.issue(&dir, "gateway-client", false);
    let auth = dir.join("auth.toml");
    std::fs::write(&auth, auth_file("")).unwrap();
    let Some(etcd) = EtcdCluster::start(&dir, 3) else {
        return;
    };
    let endpoints = etcd.endpoints();

    let node_port = free_port();
    let node_args = {
        let (ep, ca_pem, auth) = (endpoints.clone(), arg(&ca_pem), arg(&auth));
        let (c, k) = (arg(&node_cert), arg(&node_key));
        move |_: &Path| {
            vec![
                "--listen".to_string(),
                format!("127.0.0.1:{node_port}"),
                "--advertise".into(),
                format!("https://127.0.0.1:{node_port}"),
                "--etcd".into(),
                ep,
                "--tls-cert".into(),
                c,
                "--tls-key".into(),
                k,
                "--tls-client-ca".into(),
                ca_pem,
                "--auth".into(),
                auth,
            ]
        }
    };
    let Some(node) = Daemon::start_with(node_args).await else {
        return;
    };

    let gw_port = free_port();
    let log = dir.join("gateway.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(&gw_bin)
        .args(["--etcd", &endpoints])
        .args(["--listen", &format!("127.0.0.1:{gw_port}")])
        .args(["--tls-cert", &arg(&gw_cert), "--tls-key", &arg(&gw_key)])
        .args(["--auth", &arg(&auth)])
        .args(["--node-ca", &arg(&ca_pem)])
        .args([
            "--node-cert",
            &arg(&gw_client),
            "--node-key",
            &arg(&gw_client_key),
        ])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawning warren-gateway");
    let _gw = Gw(child, log);

    let admin = https(gw_port, &ca_pem, Some(TOKEN_OPS));
    // Wait until the gateway answers and sees the node ready.
    let started = Instant::now();
    loop {
        if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_secs(2), admin.cluster()).await {
            if info
                .nodes
                .iter()
                .any(|n| n.state == warren_types::NodeState::Ready)
            {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the gateway never showed the node ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A tenant works through the gateway: create, exec, and the sandbox is on the node.
    let a = https(gw_port, &ca_pem, Some(TOKEN_A));
    let id = a.create(&CreateSandboxRequest::default()).await.unwrap().id;
    let r = a
        .exec(&id, &ExecRequest::shell("echo through the gateway"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "through the gateway\n");
    assert_eq!(a.list(&Default::default(), None).await.unwrap().len(), 1);
    assert_eq!(node.list().await.len(), 1, "the sandbox lives on the node");

    // Another tenant does not see it, through the gateway either.
    let b = https(gw_port, &ca_pem, Some(TOKEN_B));
    assert_eq!(code(b.get(&id).await), ErrorCode::NotFound);
    assert!(b.list(&Default::default(), None).await.unwrap().is_empty());

    // No token, or a wrong one: 401 from the gateway, for its own routes too.
    let none = https(gw_port, &ca_pem, None);
    assert!(none.get(&id).await.unwrap_err().is_unauthorized());
    assert!(none.cluster().await.unwrap_err().is_unauthorized());
    let wrong = https(gw_port, &ca_pem, Some("not-a-token"));
    assert!(wrong.get(&id).await.unwrap_err().is_unauthorized());

    // A user token sees nothing summed over other tenants: no cluster view (every node's
    // load and images), no cluster-wide sandbox count.
    assert_eq!(code(a.cluster().await), ErrorCode::Forbidden);
    let h = a.health().await.unwrap();
    assert!(!h.extra.contains_key("sandboxes"), "{:?}", h.extra);
    let h = admin.health().await.unwrap();
    assert!(h.extra.contains_key("sandboxes"), "{:?}", h.extra);

    // Draining needs an administrator.
    let node_id = node.node.clone();
    assert_eq!(code(a.drain(&node_id).await), ErrorCode::Forbidden);
    admin.drain(&node_id).await.unwrap();
    admin.undrain(&node_id).await.unwrap();

    // The node itself refuses callers without a client certificate, token or not.
    let direct = https(node_port, &ca_pem, Some(TOKEN_OPS));
    let e = direct.get(&id).await.unwrap_err();
    assert!(
        e.code().is_none(),
        "reached the node's API without a certificate: {e}"
    );

    a.delete(&id).await.unwrap();
    drop(node);
    drop(etcd);
    let _ = std::fs::remove_dir_all(&dir);
}
