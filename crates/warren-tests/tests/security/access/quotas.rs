//! Quotas: `429 quota_exceeded` with `Retry-After` and the quota named; the sandbox quota
//! holds exactly under 200 concurrent creates; reservations come back on delete.

use std::collections::BTreeMap;

use warren_client::{CreateSandboxRequest, ErrorCode};

use crate::{auth_file, daemon, sha, tcp};

const TOKEN_Q: &str = "token-of-quota-tenant";

fn quota_tenant(quotas: &str) -> String {
    auth_file(&format!(
        "[[tenant]]\nname = \"q\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n{quotas}\n",
        sha(TOKEN_Q)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_creates_never_exceed_the_sandbox_quota() {
    const MAX: usize = 5;
    let Some((d, port)) = daemon(&quota_tenant(&format!("max_sandboxes = {MAX}")), &[]).await
    else {
        return;
    };
    let q = tcp(port, Some(TOKEN_Q));
    let results = futures::future::join_all((0..200).map(|_| {
        let q = q.clone();
        async move { q.create(&CreateSandboxRequest::default()).await }
    }))
    .await;
    let mut created = 0;
    for r in &results {
        match r {
            Ok(_) => created += 1,
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded), "{e}");
                assert_eq!(e.status(), Some(429));
                let api = e.api_error().unwrap();
                assert!(api.message.contains("max_sandboxes"), "{}", api.message);
                assert!(api.retry_after.is_some_and(|s| s >= 1));
            }
        }
    }
    assert_eq!(created, MAX, "exactly the quota is created");
    assert_eq!(q.list(&BTreeMap::new(), None).await.unwrap().len(), MAX);
    assert_eq!(
        d.list().await.len(),
        MAX,
        "the node holds no more than the quota"
    );
    // A delete gives the reservation back.
    let one = q.list(&BTreeMap::new(), None).await.unwrap().remove(0).id;
    q.delete(&one).await.unwrap();
    q.create(&CreateSandboxRequest::default()).await.unwrap();
    let e = q
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded));
    // Other tenants are not limited by q's quota.
    crate::tcp(port, Some(crate::TOKEN_A))
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_memory_and_cpu_quotas_answer_429_with_retry_after() {
    let Some((_d, port)) = daemon(
        &quota_tenant(
            "creates_per_second = 0.01\ncreate_burst = 3\nmax_memory_mb = 700\nmax_cpus = 1.5",
        ),
        &[],
    )
    .await
    else {
        return;
    };
    let q = tcp(port, Some(TOKEN_Q));
    let mem = |mb: u64, cpus: f64| CreateSandboxRequest {
        memory_mb: Some(mb),
        cpus: Some(cpus),
        ..Default::default()
    };
    let first = q.create(&mem(512, 0.5)).await.unwrap();
    let e = q.create(&mem(256, 0.5)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded), "{e}");
    assert!(e.to_string().contains("max_memory_mb"), "{e}");
    let e = q.create(&mem(128, 1.5)).await.unwrap_err();
    assert!(e.to_string().contains("max_cpus"), "{e}");
    // Every attempt above took a creation token (the rate is checked first): the bucket of
    // 3 is empty now, and refills one token per 100 s.
    q.delete(&first.id).await.unwrap();
    let e = q.create(&mem(128, 0.5)).await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::QuotaExceeded), "{e}");
    let api = e.api_error().unwrap();
    assert!(
        api.message.contains("creates_per_second"),
        "{}",
        api.message
    );
    assert!(api.retry_after.is_some_and(|s| s >= 1), "{api:?}");
    // Retry-After is a header too, not only in the body.
    let (status, headers) = raw_create(port, TOKEN_Q).await;
    assert_eq!(status, 429);
    assert!(headers.contains("retry-after"), "{headers}");
}

/// One create over a raw connection: `(status, header names)`.
async fn raw_create(port: u16, token: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    let conn = tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method("POST")
        .uri("/v1/sandboxes")
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let names = resp
        .headers()
        .keys()
        .map(|k| k.as_str().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let _ = resp.into_body().collect().await;
    conn.abort();
    (status, names)
}
