//! Pause, resume and fork tests against the fake runtime.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use warren_types::{
    Caller, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, SandboxId, TrajectoryCall,
};

use crate::manager::*;
use crate::testing::Calls as _;
use crate::testing::{manager_in, manager_with, FakeRuntime};

fn id_of(info: &SandboxInfo) -> SandboxId {
    info.id.parse().unwrap()
}

fn stored_state(m: &Manager, id: &SandboxId) -> SandboxState {
    m.inner
        .store
        .load()
        .unwrap()
        .sandboxes
        .iter()
        .find(|s| s.info.id == id.as_str())
        .unwrap()
        .info
        .state
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_pause_and_a_call_resumes_them() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let info = m
        .create(CreateSandboxRequest {
            idle_timeout_secs: Some(5),
            ..Default::default()
        })
        .await
        .unwrap()
        .info;
    let id = id_of(&info);
    assert!(m.reap(now_ms() + 1_000).await.is_empty());
    let done = m.reap(now_ms() + 6_000).await;
    assert_eq!(done, vec![(id.clone(), IDLE_PAUSED)]);
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Paused);
    assert_eq!(stored_state(&m, &id), SandboxState::Paused);
    assert!(!rt.instance(&info.id).destroyed.load(Ordering::SeqCst));
    // Paused sandboxes are not paused again.
    assert!(m.reap(now_ms() + 60_000).await.is_empty());

    let r = m
        .procs()
        .exec(&id, ExecRequest::argv(["true"]))
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(rt.shared.resumes.load(Ordering::SeqCst), 1);
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Running);
    assert_eq!(stored_state(&m, &id), SandboxState::Running);
    // Files resume it too.
    m.pause(&id).await.unwrap();
    assert_eq!(m.files().stat(&id, "/x").await.unwrap().name, "/x");
    assert_eq!(rt.shared.resumes.load(Ordering::SeqCst), 2);
    assert_eq!(m.parts().telemetry.metrics().paused_idle.get(), 1);
    // Every pause and resume is in the trajectory, with who paused it.
    let calls: Vec<TrajectoryCall> = m
        .entries(&id, 1)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.call)
        .filter(|c| !matches!(c, TrajectoryCall::Exec(_)))
        .collect();
    assert_eq!(
        calls,
        [
            TrajectoryCall::Pause { by: "idle".into() },
            TrajectoryCall::Resume {},
            TrajectoryCall::Pause { by: "call".into() },
            TrajectoryCall::Resume {},
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_by_call() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    let s = m.pause(&id).await.unwrap();
    assert_eq!((s.memory_before_bytes, s.memory_after_bytes), (1000, 100));
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Paused);
    // Again: still paused, no error.
    m.pause(&id).await.unwrap();
    assert_eq!(m.resume(&id).await.unwrap().state, SandboxState::Running);
    assert_eq!(m.resume(&id).await.unwrap().state, SandboxState::Running);
    assert_eq!(rt.shared.resumes.load(Ordering::SeqCst), 1);
    // A replayed step does not wake a paused sandbox.
    let req = ExecRequest {
        step: Some(0),
        ..ExecRequest::argv(["true"])
    };
    m.procs().exec(&id, req.clone()).await.unwrap();
    m.pause(&id).await.unwrap();
    assert!(m.procs().exec(&id, req).await.unwrap().replayed);
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Paused);
    // Deleting a paused sandbox works.
    m.delete(&id).await.unwrap();

    // A substrate that cannot pause says so.
    rt.no_pause.store(true, Ordering::SeqCst);
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    let e = m.pause(&id).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnsupportedSubstrate);
    assert_eq!(m.get(&id).unwrap().state, SandboxState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_paused_sandboxes_paused() {
    let dir = tempfile::tempdir().unwrap();
    let rt = std::sync::Arc::new(FakeRuntime::default());
    let (paused, running) = {
        let m = manager_with(dir.path(), rt.clone(), |_| {});
        let a = id_of(&m.create(Default::default()).await.unwrap().info);
        let b = id_of(&m.create(Default::default()).await.unwrap().info);
        m.pause(&a).await.unwrap();
        m.shutdown();
        (a, b)
    };
    let m = manager_with(dir.path(), rt.clone(), |_| {});
    let report = m.recover().await.unwrap();
    assert_eq!(report.adopted.len(), 2);
    assert_eq!(m.get(&paused).unwrap().state, SandboxState::Paused);
    assert_eq!(m.get(&running).unwrap().state, SandboxState::Running);
    assert_eq!(stored_state(&m, &paused), SandboxState::Paused);
    m.procs()
        .exec(&paused, ExecRequest::argv(["true"]))
        .await
        .unwrap();
    assert_eq!(m.get(&paused).unwrap().state, SandboxState::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_makes_children_that_start_from_the_parent() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let parent = m
        .create(CreateSandboxRequest {
            memory_mb: Some(64),
            env: BTreeMap::from([("A".into(), "1".into())]),
            labels: BTreeMap::from([("run".into(), "r".into()), ("k".into(), "p".into())]),
            ttl_secs: Some(3600),
            ..Default::default()
        })
        .await
        .unwrap()
        .info;
    let pid = id_of(&parent);
    for i in 0..3 {
        m.procs()
            .exec(
                &pid,
                ExecRequest {
                    step: Some(i),
                    ..ExecRequest::argv(["true"])
                },
            )
            .await
            .unwrap();
    }
    m.pause(&pid).await.unwrap();
    let kids = m
        .fork(
            &pid,
            ForkRequest {
                n: 3,
                labels: BTreeMap::from([("k".into(), "c".into())]),
            },
        )
        .await
        .unwrap();
    assert_eq!(kids.len(), 3);
    // The parent stays as it was.
    assert_eq!(m.get(&pid).unwrap().state, SandboxState::Paused);
    let forked = rt.forked.lock().unwrap().clone();
    assert_eq!(forked[0].0, pid);
    for k in &kids {
        assert_ne!(k.id, parent.id);
        assert_eq!(k.state, SandboxState::Running);
        assert_eq!(k.limits, parent.limits);
        assert_eq!(k.env, parent.env);
        assert_eq!(k.image, parent.image);
        assert_eq!(k.labels["run"], "r");
        assert_eq!(k.labels["k"], "c");
        assert!(k.expires_at_ms.is_some());
        let kid = id_of(k);
        assert!(forked[0].1.contains(&kid));
        let log = m.entries(&kid, 1).await.unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(
            log[0].call,
            TrajectoryCall::ForkedFrom {
                parent: parent.id.clone(),
                // Three execs, then the pause.
                parent_seq: 4,
            }
        );
        // Children have their own steps.
        let r = m
            .procs()
            .exec(
                &kid,
                ExecRequest {
                    step: Some(0),
                    ..ExecRequest::argv(["other"])
                },
            )
            .await
            .unwrap();
        assert!(!r.replayed);
        assert_eq!(stored_state(&m, &kid), SandboxState::Running);
    }
    // Three execs and the pause come first.
    let plog = m.entries(&pid, 5).await.unwrap();
    assert!(matches!(&plog[0].call, TrajectoryCall::Fork { children, .. } if children.len() == 3));
    assert_eq!(m.count(), 4);

    // Refused and failed forks leave nothing behind.
    let bad = ForkRequest {
        n: 0,
        labels: BTreeMap::new(),
    };
    assert_eq!(
        m.fork(&pid, bad).await.unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    rt.fail_fork.store(true, Ordering::SeqCst);
    let e = m
        .fork(
            &pid,
            ForkRequest {
                n: 2,
                labels: BTreeMap::new(),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::StartFailed);
    assert_eq!(m.count(), 4);
    assert_eq!(m.inner.store.load().unwrap().sandboxes.len(), 4);
}

#[tokio::test]
async fn a_fork_naming_a_step_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _rt) = manager_in(dir.path(), |_| {});
    let parent = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let pid = id_of(&parent);
    let admin = Caller::admin();
    let req = || ForkRequest {
        n: 2,
        labels: BTreeMap::from([("k".into(), "c".into())]),
    };
    let first = m.fork_step(&admin, &pid, req(), Some(5)).await.unwrap();
    assert!(!first.replayed);
    assert_eq!(first.answer.len(), 2);
    assert_eq!(m.count(), 3);

    // The same step again answers the same children and makes none.
    let again = m.fork_step(&admin, &pid, req(), Some(5)).await.unwrap();
    assert!(again.replayed);
    let ids = |v: &[warren_types::SandboxInfo]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&again.answer), ids(&first.answer));
    assert_eq!(m.count(), 3);

    // Another request under the same step, and a step below the last, are conflicts.
    let other = ForkRequest { n: 3, ..req() };
    let e = m.fork_step(&admin, &pid, other, Some(5)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    let e = m.fork_step(&admin, &pid, req(), Some(4)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::StepConflict);
    assert_eq!(m.count(), 3);

    // The parent's entry carries the step and the request.
    let log = m.entries(&pid, 1).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].step, Some(5));
    match &log[0].call {
        TrajectoryCall::Fork {
            children,
            n,
            labels,
        } => {
            assert_eq!(children, &ids(&first.answer));
            assert_eq!(*n, Some(2));
            assert_eq!(labels["k"], "c");
        }
        other => panic!("not a fork entry: {other:?}"),
    }

    // A child deleted since is left out of the replayed answer.
    let gone: SandboxId = first.answer[0].id.parse().unwrap();
    m.delete(&gone).await.unwrap();
    let replay = m.fork_step(&admin, &pid, req(), Some(5)).await.unwrap();
    assert_eq!(ids(&replay.answer), ids(&first.answer[1..]));
    assert_eq!(m.count(), 2);
}
