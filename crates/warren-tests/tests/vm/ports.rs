//! `/v1/sandboxes/{id}/ports/{port}/...` into a microVM: the guest's loopback is reached
//! through its agent (no network interface needed), bodies both ways, nothing listening is
//! 502 `port_unreachable`.

use std::time::Duration;

use warren_client::{CreateSandboxRequest, ErrorCode, ExecRequest, Substrate};

use crate::common::{self, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_reaches_a_server_inside_a_microvm_through_its_agent() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let served = d.client().health().await.unwrap().substrates;
    if !served.iter().any(|s| s == "microvm") {
        common::skip(format!(
            "the daemon does not serve microvm; its log says:\n{}",
            d.log_tail(20)
        ));
        return;
    }
    let id = d
        .create(&CreateSandboxRequest {
            substrate: Substrate::Microvm,
            memory_mb: Some(256),
            ..Default::default()
        })
        .await
        .id;
    let c = d.client();
    d.sh_ok(&id, "mkdir -p /srv && echo guest > /srv/f.txt")
        .await;
    c.spawn(
        &id,
        &ExecRequest::shell("python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv"),
    )
    .await
    .unwrap();
    let none = hyper::HeaderMap::new();
    let mut answer = None;
    // Python starts slowly under emulation.
    for _ in 0..600 {
        match c
            .port_request(
                &id,
                8000,
                hyper::Method::GET,
                "/f.txt",
                &none,
                bytes::Bytes::new(),
            )
            .await
        {
            Ok(a) => {
                answer = Some(a);
                break;
            }
            Err(e) if e.code() == Some(ErrorCode::PortUnreachable) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("GET into the guest: {e}"),
        }
    }
    let a = answer.expect("the guest's server listened within 60 s");
    assert_eq!(a.status, 200);
    assert_eq!(a.headers["warren-port"], "8000");
    assert_eq!(&a.body.collect_bytes().await.unwrap()[..], b"guest\n");
    // A larger answer than the relay's window: a 3 MiB file.
    d.sh_ok(
        &id,
        "head -c 3145728 /dev/urandom > /srv/big && sha256sum /srv/big",
    )
    .await;
    let want = d.sh_ok(&id, "sha256sum < /srv/big").await;
    let big = c
        .port_request(
            &id,
            8000,
            hyper::Method::GET,
            "/big",
            &none,
            bytes::Bytes::new(),
        )
        .await
        .unwrap()
        .body
        .collect_bytes()
        .await
        .unwrap();
    assert_eq!(big.len(), 3 << 20);
    use sha2::Digest;
    let got = hex::encode(sha2::Sha256::digest(&big));
    assert!(want.starts_with(&got), "{want} vs {got}");
    let e = c
        .port_request(
            &id,
            8001,
            hyper::Method::GET,
            "/",
            &none,
            bytes::Bytes::new(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::PortUnreachable), "{e}");
    c.delete(&id).await.unwrap();
}
