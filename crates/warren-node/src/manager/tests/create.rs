//! A create in flight: repeated creates with its idempotency key and calls that reach the
//! sandbox early wait for its outcome.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use warren_types::{CreateSandboxRequest, ErrorCode, ExecRequest, SandboxId, SandboxState};

use crate::testing::Calls as _;
use crate::testing::{manager_in, FakeRuntime};
use crate::Manager;

fn keyed(key: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        idempotency_key: Some(key.into()),
        ..Default::default()
    }
}

/// Holds every create of `rt` until the returned gate gets permits.
fn hold(rt: &FakeRuntime) -> Arc<Semaphore> {
    let gate = Arc::new(Semaphore::new(0));
    *rt.create_gate.lock().unwrap() = Some(gate.clone());
    gate
}

/// Starts a create and waits until the runtime has been asked for it (it is then `creating`).
async fn start_held(
    m: &Manager,
    rt: &FakeRuntime,
    req: CreateSandboxRequest,
) -> (
    tokio::task::JoinHandle<Result<crate::manager::Created, crate::NodeError>>,
    SandboxId,
) {
    let before = rt.created.lock().unwrap().len();
    let m2 = m.clone();
    let first = tokio::spawn(async move { m2.create(req).await });
    let id = loop {
        if let Some(spec) = rt.created.lock().unwrap().get(before) {
            break spec.id.clone();
        }
        tokio::task::yield_now().await;
    };
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Creating);
    (first, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_create_waits_for_the_first_and_answers_the_running_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let gate = hold(&rt);
    let (first, id) = start_held(&m, &rt, keyed("resume-1")).await;

    let m2 = m.clone();
    let again = tokio::spawn(async move { m2.create(keyed("resume-1")).await });
    let m3 = m.clone();
    let id3 = id.clone();
    let exec = tokio::spawn(async move {
        m3.procs()
            .exec(
                &id3,
                ExecRequest {
                    argv: Some(vec!["true".into()]),
                    ..Default::default()
                },
            )
            .await
    });
    // Neither may answer while the first create is in flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !again.is_finished(),
        "a repeated create answered a creating sandbox"
    );
    assert!(!exec.is_finished(), "an exec did not wait for the create");

    gate.add_permits(1);
    let first = first.await.unwrap().unwrap();
    let again = again.await.unwrap().unwrap();
    assert!(first.created && !again.created);
    assert_eq!(again.info.id, id.to_string());
    assert_eq!(again.info.state, SandboxState::Running);
    let out = exec.await.unwrap().unwrap();
    assert_eq!(out.exit_code, Some(3));
    assert_eq!(rt.created.lock().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_create_of_a_failed_start_answers_the_same_error() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let gate = hold(&rt);
    rt.fail_create.store(true, Ordering::SeqCst);
    let (first, id) = start_held(&m, &rt, keyed("resume-2")).await;
    let m2 = m.clone();
    let again = tokio::spawn(async move { m2.create(keyed("resume-2")).await });
    let m3 = m.clone();
    let id3 = id.clone();
    let stat = tokio::spawn(async move { m3.files().stat(&id3, "/workspace").await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!again.is_finished() && !stat.is_finished());

    gate.add_permits(1);
    let e1 = first.await.unwrap().unwrap_err();
    let e2 = again.await.unwrap().unwrap_err();
    assert_eq!(e1.code(), ErrorCode::StartFailed);
    assert_eq!(e2.code(), ErrorCode::StartFailed);
    assert_eq!(e1.to_api().message, e2.to_api().message);
    assert_eq!(
        stat.await.unwrap().unwrap_err().code(),
        ErrorCode::StartFailed
    );
    // Only one start was attempted, and nothing is left.
    assert_eq!(rt.created.lock().unwrap().len(), 1);
    assert_eq!(m.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_waits_for_a_create_only_within_its_own_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let gate = hold(&rt);
    let (first, id) = start_held(&m, &rt, CreateSandboxRequest::default()).await;
    let e = m
        .procs()
        .exec(
            &id,
            ExecRequest {
                argv: Some(vec!["true".into()]),
                timeout_secs: Some(0.05),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidState);
    assert!(e.to_string().contains("being created"), "{e}");
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 0);
    gate.add_permits(1);
    assert!(first.await.unwrap().unwrap().created);
}

/// A create whose caller goes away while it is in flight (a client that left a create or a
/// revive: its future is dropped) still runs to its end: the sandbox is `running`, never
/// left `creating`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_caller_goes_away_runs_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let gate = hold(&rt);
    let (first, id) = start_held(&m, &rt, CreateSandboxRequest::default()).await;
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    gate.add_permits(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while m.get(&id).unwrap().state == SandboxState::Creating {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sandbox stayed creating"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Running);
}
