//! The client's request timeout bounds hung calls, not calls that say they run longer: an
//! exec (or a process wait) with its own `timeout_secs` beyond the request timeout gets its
//! answer; one without is cut at the request timeout. A small axum server on a Unix socket
//! answers after a delay.

use std::time::Duration;

use axum::routing::post;
use axum::{Json, Router};
use warren_client::{Client, ClientError, ExecRequest, ExecResult};

/// How late the server answers, and the client's request timeout (well below it).
const ANSWER_AFTER: Duration = Duration::from_millis(1500);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(300);

async fn slow_exec() -> Json<ExecResult> {
    tokio::time::sleep(ANSWER_AFTER).await;
    Json(ExecResult {
        exit_code: Some(0),
        stdout: "late\n".into(),
        ..Default::default()
    })
}

async fn start() -> (Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("warren.sock");
    let app = Router::new()
        .route("/v1/sandboxes/{id}/exec", post(slow_exec))
        .route("/v1/sandboxes/{id}/processes/{pid}/wait", post(slow_exec));
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = Client::builder()
        .url(format!("unix://{}", sock.display()))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .build()
        .unwrap();
    (client, dir)
}

#[tokio::test]
async fn an_exec_that_says_it_runs_longer_than_the_request_timeout_gets_its_answer() {
    let (client, _dir) = start().await;
    let mut req = ExecRequest::shell("sleep 1");
    req.timeout_secs = Some(10.0);
    let r = client.exec("n1-x", &req).await.expect("the exec's answer");
    assert_eq!(r.stdout, "late\n");

    let r = client
        .wait_process("n1-x", 7, Some(Duration::from_secs(10)))
        .await
        .expect("the wait's answer");
    assert_eq!(r.exit_code, Some(0));
}

#[tokio::test]
async fn a_call_without_its_own_time_is_cut_at_the_request_timeout() {
    let (client, _dir) = start().await;
    let e = client
        .exec("n1-x", &ExecRequest::shell("sleep 1"))
        .await
        .expect_err("cut by the request timeout");
    assert!(
        matches!(e, ClientError::Timeout(t) if t == REQUEST_TIMEOUT),
        "{e}"
    );

    let e = client
        .wait_process("n1-x", 7, None)
        .await
        .expect_err("cut by the request timeout");
    assert!(matches!(e, ClientError::Timeout(_)), "{e}");
}
