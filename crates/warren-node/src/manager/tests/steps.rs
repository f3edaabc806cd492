//! Trajectory and step tests: replay runs nothing, conflicts are refused, a step runs once
//! under concurrency and across restarts, and the export says what ran.

use std::sync::atomic::Ordering;
use std::time::Duration;
use warren_types::{
    CreateSandboxRequest, ErrorCode, ExecRequest, ExecResult, OutputEncoding, SandboxId,
    TrajectoryCall, TrajectoryResult,
};

use crate::manager::*;
use crate::testing::Calls as _;
use crate::testing::{manager_in, manager_with, FakeRuntime};

fn id_of(info: &SandboxInfo) -> SandboxId {
    info.id.parse().unwrap()
}

async fn sandbox(m: &Manager) -> SandboxId {
    id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    )
}

fn step(cmd: &str, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

fn bytes_of(
    s: &'static [u8],
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin {
    futures::stream::iter([Ok(bytes::Bytes::from_static(s))])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_step_answers_its_record_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let first = m.procs().exec(&id, step("echo a", 0)).await.unwrap();
    assert!(!first.replayed);
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 1);
    for _ in 0..3 {
        let again = m.procs().exec(&id, step("echo a", 0)).await.unwrap();
        assert!(again.replayed);
        assert_eq!(
            ExecResult {
                replayed: false,
                ..again
            },
            first
        );
    }
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 1);

    // File changes replay too, and run nothing.
    assert!(!m
        .files()
        .write_file(&id, "/f", None, None, Some(1), bytes_of(b"abc"))
        .await
        .unwrap());
    assert!(!m
        .files()
        .mkdir(&id, "/d", true, None, Some(2))
        .await
        .unwrap());
    let changes = rt.shared.changes.load(Ordering::SeqCst);
    assert!(m
        .files()
        .write_file(&id, "/f", None, None, Some(1), bytes_of(b"abc"))
        .await
        .unwrap());
    assert!(m
        .files()
        .mkdir(&id, "/d", true, None, Some(2))
        .await
        .unwrap());
    assert_eq!(rt.shared.changes.load(Ordering::SeqCst), changes);
    // Calls without a step always run.
    m.procs()
        .exec(&id, ExecRequest::shell("echo a"))
        .await
        .unwrap();
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 2);
    assert_eq!(m.parts().telemetry.metrics().replays.get(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_request_at_a_logged_step_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    m.procs().exec(&id, step("echo a", 0)).await.unwrap();
    let e = m.procs().exec(&id, step("echo b", 0)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    assert_eq!(e.code().http_status(), 409);
    assert!(e.to_string().contains("step 0"), "{e}");
    // Another kind of call at that step conflicts too.
    let e = m
        .files()
        .mkdir(&id, "/d", false, None, Some(0))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    // A write with other content at a logged write step.
    m.files()
        .write_file(&id, "/f", None, None, Some(1), bytes_of(b"one"))
        .await
        .unwrap();
    let e = m
        .files()
        .write_file(&id, "/f", None, None, Some(1), bytes_of(b"two"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    // Steps may skip, but never go back to one that was not logged.
    m.procs().exec(&id, step("echo c", 5)).await.unwrap();
    let e = m.procs().exec(&id, step("echo d", 3)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 2);
    assert_eq!(m.parts().telemetry.metrics().step_conflicts.get(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_of_one_step_run_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let calls = (0..16).map(|_| {
        let (m, id) = (m.clone(), id.clone());
        tokio::spawn(async move {
            m.procs()
                .exec(
                    &id,
                    ExecRequest {
                        step: Some(1),
                        ..ExecRequest::argv(["slow"])
                    },
                )
                .await
                .unwrap()
        })
    });
    let results: Vec<ExecResult> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 1);
    assert_eq!(results.iter().filter(|r| !r.replayed).count(), 1);
    for r in &results {
        assert_eq!(r.stdout, results[0].stdout);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_whose_caller_went_away_runs_on_and_answers_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let req = ExecRequest {
        step: Some(4),
        ..ExecRequest::argv(["slow"])
    };
    let (m2, id2, req2) = (m.clone(), id.clone(), req.clone());
    let caller = tokio::spawn(async move { m2.procs().exec(&id2, req2).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The client is killed between request and response.
    caller.abort();
    let retry = m.procs().exec(&id, req).await.unwrap();
    assert!(retry.replayed);
    assert_eq!(retry.exit_code, Some(3));
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 1);
    let log = m.entries(&id, 1).await.unwrap();
    assert_eq!(log.len(), 1);
    assert!(!log[0].cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_and_the_log_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let rt = std::sync::Arc::new(FakeRuntime::default());
    let id = {
        let m = manager_with(dir.path(), rt.clone(), |_| {});
        let id = sandbox(&m).await;
        for i in 0..4 {
            m.procs()
                .exec(&id, step(&format!("echo {i}"), i))
                .await
                .unwrap();
        }
        m.shutdown();
        id
    };
    let m = manager_with(dir.path(), rt.clone(), |_| {});
    m.recover().await.unwrap();
    let again = m.procs().exec(&id, step("echo 2", 2)).await.unwrap();
    assert!(again.replayed);
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 4);
    assert_eq!(
        m.procs()
            .exec(&id, step("echo x", 3))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::StepConflict
    );
    assert!(
        !m.procs()
            .exec(&id, step("echo 4", 4))
            .await
            .unwrap()
            .replayed
    );
    let log = m.entries(&id, 1).await.unwrap();
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
    assert_eq!(log[4].step, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_says_what_ran_and_stores_big_output_once() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    // The fake echoes stdin after the spec: 5 KiB of it makes a blob.
    let big = "x".repeat(5000);
    let with_stdin = ExecRequest {
        stdin: Some(big.clone()),
        step: Some(0),
        ..ExecRequest::argv(["cat"])
    };
    let r = m.procs().exec(&id, with_stdin.clone()).await.unwrap();
    assert!(r.stdout.ends_with(&big));
    m.procs()
        .exec(
            &id,
            ExecRequest {
                step: Some(1),
                ..with_stdin.clone()
            },
        )
        .await
        .unwrap();
    m.files()
        .write_file(&id, "/f", Some(0o600), None, Some(2), bytes_of(b"abc"))
        .await
        .unwrap();
    m.files().mkdir(&id, "/d", true, None, None).await.unwrap();
    m.files().chmod(&id, "/d", 0o700, None).await.unwrap();
    m.files().remove(&id, "/d", true, None).await.unwrap();
    m.procs().kill_proc(&id, 42, 15, None).await.unwrap();
    // Refused before it reaches the sandbox: not logged.
    assert!(m
        .files()
        .mkdir(&id, "/d", true, Some(0o17777), None)
        .await
        .is_err());

    let log = m.entries(&id, 1).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.call.kind()).collect();
    assert_eq!(
        kinds,
        [
            "exec",
            "exec",
            "write_file",
            "mkdir",
            "chmod",
            "remove",
            "kill"
        ]
    );
    assert!(log.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
    let TrajectoryCall::Exec(call) = &log[0].call else {
        panic!("not an exec")
    };
    assert_eq!(call.argv.as_deref(), Some(&["cat".to_string()][..]));
    assert_eq!(
        call.stdin_sha256.as_deref(),
        Some(crate::trajectory::hex(&crate::trajectory::sha256(big.as_bytes())).as_str())
    );
    assert_eq!(call.stdin_bytes, 5000);
    match &log[0].result {
        Some(TrajectoryResult::Exec(o)) => {
            assert_eq!(o.result.stdout, r.stdout);
            assert_eq!(o.result.exit_code, Some(3));
            assert_eq!(o.result.stderr, "err");
        }
        other => panic!("result {other:?}"),
    }
    assert_eq!(
        log[2].call,
        TrajectoryCall::WriteFile {
            path: "/f".into(),
            mode: Some(0o600),
            sha256: crate::trajectory::hex(&crate::trajectory::sha256(b"abc")),
            size: 3,
        }
    );
    assert_eq!(log[2].step, Some(2));
    assert!(log.iter().all(|e| e.request_sha256.len() == 64));
    // From a position on.
    assert_eq!(m.entries(&id, 6).await.unwrap().len(), 2);
    // The two identical outputs share one blob, the stdin (kept for revive) is another;
    // deleting the sandbox drops them.
    assert_eq!(m.journal().read().unwrap().blob_count().unwrap(), 2);
    // Each is one file beside the state file, counted in the node's state size.
    assert_eq!(m.journal().blob_dir().count(), 2);
    assert!(m.journal().blob_dir().bytes() >= 5000);
    m.delete(&id).await.unwrap();
    assert_eq!(m.journal().read().unwrap().blob_count().unwrap(), 0);
    assert_eq!(m.journal().blob_dir().count(), 0, "the files go too");
    assert_eq!(m.journal().blob_dir().bytes(), 0);
    assert_eq!(
        m.journal().read().unwrap().tail(&id).unwrap(),
        (0, None),
        "the trajectory goes with the sandbox"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_step_replays_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let req = ExecRequest {
        step: Some(0),
        ..ExecRequest::argv(["x"])
    };
    let mut s = m.procs().exec_stream(&id, req.clone()).await.unwrap();
    let mut first = Vec::new();
    while let Some(ev) = s.next().await {
        first.push(ev);
    }
    let mut s = m.procs().exec_stream(&id, req.clone()).await.unwrap();
    let mut again = Vec::new();
    while let Some(ev) = s.next().await {
        again.push(ev);
    }
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), 1);
    match (first.last(), again.last()) {
        (
            Some(warren_types::ExecEvent::Exit { result: a }),
            Some(warren_types::ExecEvent::Exit { result: b }),
        ) => {
            assert!(!a.replayed && b.replayed);
            assert_eq!(a.exit_code, b.exit_code);
        }
        other => panic!("{other:?}"),
    }
    // One-shot and streamed execs of one command are the same step.
    assert!(m.procs().exec(&id, req).await.unwrap().replayed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_leaves_no_trajectory_behind_even_with_calls_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let (m, id) = (m.clone(), id.clone());
            tokio::spawn(async move {
                let req = ExecRequest {
                    step: (i % 2 == 0).then_some(i),
                    ..ExecRequest::argv(["slow"])
                };
                m.procs().exec(&id, req).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(50)).await;
    m.delete(&id).await.unwrap();
    // (The fake's slow commands may still answer after the destroy.)
    for c in calls {
        let _ = c.await.unwrap();
    }
    // Whatever the calls logged as they failed went with the sandbox.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(m.journal().read().unwrap().tail(&id).unwrap(), (0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_dropped_by_its_caller_stops_at_once_and_is_logged_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let events = m
        .procs()
        .exec_stream(&id, ExecRequest::argv(["slow"]))
        .await
        .unwrap();
    drop(events);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let log = m.entries(&id, 1).await.unwrap();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(log[0].cancelled && log[0].result.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_export_shows_text_as_text_and_only_binary_as_base64() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    // Asked in base64, printed text (the fake echoes stdin after the spec).
    let text = ExecRequest {
        stdin: Some("hello".into()),
        encoding: OutputEncoding::Base64,
        ..ExecRequest::argv(["cat"])
    };
    let answered = m.procs().exec(&id, text).await.unwrap();
    assert_eq!(
        answered.encoding,
        OutputEncoding::Base64,
        "the answer keeps its encoding"
    );
    // Asked as text, printed bytes that are not UTF-8.
    let binary = ExecRequest {
        stdin: Some(b64.encode([0xff, 0x00, 0xfe])),
        stdin_encoding: OutputEncoding::Base64,
        ..ExecRequest::argv(["cat"])
    };
    m.procs().exec(&id, binary).await.unwrap();

    let log = m.entries(&id, 1).await.unwrap();
    let outcome = |i: usize| match &log[i].result {
        Some(TrajectoryResult::Exec(o)) => o.result.clone(),
        other => panic!("result {other:?}"),
    };
    let first = outcome(0);
    assert_eq!(first.encoding, OutputEncoding::Utf8);
    assert!(first.stdout.ends_with("hello"), "{}", first.stdout);
    assert_eq!(first.stderr, "err");
    let second = outcome(1);
    assert_eq!(second.encoding, OutputEncoding::Base64);
    let raw = b64.decode(&second.stdout).unwrap();
    assert!(
        raw.ends_with(&[0xff, 0x00, 0xfe]),
        "the bytes survive: {raw:?}"
    );
    assert_eq!(b64.decode(&second.stderr).unwrap(), b"err");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_logged_step_is_read_back_where_its_record_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _rt) = manager_in(dir.path(), |_| {});
    let id = sandbox(&m).await;
    let mut first = Vec::new();
    for s in 0..40 {
        // Calls without a step between them: a step's record is not at a fixed stride.
        if s % 3 == 0 {
            m.procs()
                .exec(&id, ExecRequest::shell("echo between"))
                .await
                .unwrap();
        }
        first.push(
            m.procs()
                .exec(&id, step(&format!("echo {s}"), s))
                .await
                .unwrap(),
        );
    }
    let r = m.journal().read().unwrap();
    for s in 0..40 {
        let logged = r.step(&id, s).unwrap().expect("the step is indexed");
        assert!(logged.at.is_some(), "step {s} keeps its record's place");
        let (e, _) = r
            .step_entry(&id, &logged)
            .unwrap()
            .expect("read at its place");
        assert_eq!((e.seq, e.step), (logged.seq, Some(s)));
    }
    drop(r);
    for (s, was) in first.into_iter().enumerate() {
        let again = m
            .procs()
            .exec(&id, step(&format!("echo {s}"), s as u64))
            .await
            .unwrap();
        assert!(again.replayed);
        assert_eq!(again.stdout, was.stdout);
    }
}
