//! Manager tests against the fake runtime and fake agent of [`crate::testing`].

mod create;
mod export;
mod lifetime;
mod pause;
mod revive;
mod revive_store;
mod steps;
mod tenants;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;
use warren_types::{
    CreateSandboxRequest, ErrorCode, ExecRequest, OutputEncoding, SandboxId, SandboxState,
    Substrate,
};

use crate::manager::*;
use crate::testing::Calls as _;
use crate::testing::{manager_in, manager_with};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn id_of(info: &SandboxInfo) -> SandboxId {
    info.id.parse().unwrap()
}

#[tokio::test]
async fn invalid_requests_are_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let bad = CreateSandboxRequest {
        memory_mb: Some(1),
        ..Default::default()
    };
    let e = m.create(bad).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidRequest);
    let bad = CreateSandboxRequest {
        workdir: Some("/../x".into()),
        ..Default::default()
    };
    assert_eq!(
        m.create(bad).await.unwrap_err().code(),
        ErrorCode::InvalidPath
    );
    assert!(rt.created.lock().unwrap().is_empty());
    assert_eq!(m.count(), 0);
}

#[tokio::test]
async fn other_substrates_are_unsupported() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let e = m
        .create(CreateSandboxRequest {
            substrate: Substrate::Vm,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnsupportedSubstrate);
    assert_eq!(e.code().http_status(), 501);
    assert!(
        e.to_string().contains("vm") && e.to_string().contains("container"),
        "{e}"
    );
}

// Multi-threaded: store commits then run through `block_in_place`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_builds_the_spec_and_records_running() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let req = CreateSandboxRequest {
        image: warren_types::ImageRef::Stack(vec!["base:1".into(), "task:2".into()]),
        memory_mb: Some(64),
        labels: labels(&[("run", "a")]),
        ..Default::default()
    };
    let c = m.create(req).await.unwrap();
    assert!(c.created);
    assert_eq!(c.info.state, SandboxState::Running);
    let spec = rt.created.lock().unwrap()[0].clone();
    assert_eq!(spec.id.as_str(), c.info.id);
    assert_eq!(spec.image, ["base:1", "task:2"]);
    assert_eq!(spec.limits.memory_mb, 64);
    assert_eq!(spec.hostname, "sandbox");
    assert_eq!(spec.labels, labels(&[("run", "a")]));
    assert!(c.info.id.starts_with("n1-"));
    // Durable: the store holds the running record and the runtime's record.
    let loaded = m.inner.store.load().unwrap();
    assert_eq!(loaded.sandboxes.len(), 1);
    assert_eq!(loaded.sandboxes[0].info.state, SandboxState::Running);
    assert!(loaded.sandboxes[0].record.is_some());
}

#[tokio::test]
async fn failed_start_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    rt.fail_create.store(true, Ordering::SeqCst);
    let req = CreateSandboxRequest {
        idempotency_key: Some("k1".into()),
        ..Default::default()
    };
    let e = m.create(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::StartFailed);
    assert_eq!(m.count(), 0);
    let loaded = m.inner.store.load().unwrap();
    assert!(loaded.sandboxes.is_empty() && loaded.keys.is_empty());
    // The key is free again.
    rt.fail_create.store(false, Ordering::SeqCst);
    assert!(m.create(req).await.unwrap().created);
    assert_eq!(m.parts().telemetry.metrics().create_errors.get(), 1);
}

#[tokio::test]
async fn idempotency_keys_return_the_first_sandbox_and_survive_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(crate::testing::FakeRuntime::default());
    let req = CreateSandboxRequest {
        idempotency_key: Some("step-1".into()),
        ..Default::default()
    };
    let first_id = {
        let m = manager_with(dir.path(), rt.clone(), |_| {});
        let a = m.create(req.clone()).await.unwrap();
        let b = m.create(req.clone()).await.unwrap();
        assert!(a.created && !b.created);
        assert_eq!(a.info.id, b.info.id);
        assert_eq!(rt.created.lock().unwrap().len(), 1);
        let other = CreateSandboxRequest {
            memory_mb: Some(64),
            ..req.clone()
        };
        assert_eq!(
            m.create(other).await.unwrap_err().code(),
            ErrorCode::Conflict
        );
        a.info.id
    };
    let m = manager_with(dir.path(), rt.clone(), |_| {});
    m.recover().await.unwrap();
    let again = m.create(req.clone()).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.info.id, first_id);
    // Deleting frees the key.
    m.delete(&first_id.parse().unwrap()).await.unwrap();
    let fresh = m.create(req).await.unwrap();
    assert!(fresh.created);
    assert_ne!(fresh.info.id, first_id);
}

#[tokio::test]
async fn node_limit_is_enforced() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |c| c.max_sandboxes = 1);
    m.create(CreateSandboxRequest::default()).await.unwrap();
    let e = m.create(CreateSandboxRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::LimitExceeded);
    assert_eq!(e.to_api().retry_after, Some(5));
}

#[tokio::test]
async fn list_filters_by_every_label_and_state() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    for l in [
        &[("run", "a"), ("kind", "x")][..],
        &[("run", "a")],
        &[("run", "b"), ("kind", "x")],
    ] {
        m.create(CreateSandboxRequest {
            labels: labels(l),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let f = |l: &[(&str, &str)], state| ListFilter {
        labels: labels(l),
        state,
        substrate: None,
        tenant: None,
    };
    assert_eq!(m.list(&f(&[], None)).len(), 3);
    assert_eq!(m.list(&f(&[("run", "a")], None)).len(), 2);
    assert_eq!(m.list(&f(&[("run", "a"), ("kind", "x")], None)).len(), 1);
    assert_eq!(
        m.list(&f(&[("kind", "x")], Some(SandboxState::Running)))
            .len(),
        2
    );
    assert_eq!(m.list(&f(&[], Some(SandboxState::Failed))).len(), 0);
    let all = m.list(&f(&[], None));
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "oldest first");
    let by_substrate = |s| ListFilter {
        substrate: Some(s),
        ..Default::default()
    };
    assert_eq!(m.list(&by_substrate(Substrate::Container)).len(), 3);
    assert_eq!(m.list(&by_substrate(Substrate::Microvm)).len(), 0);
}

#[tokio::test]
async fn ttl_and_idle_timeouts_delete_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    // A substrate that cannot pause: idle sandboxes are deleted.
    rt.no_pause.store(true, Ordering::SeqCst);
    let ttl = m
        .create(CreateSandboxRequest {
            ttl_secs: Some(10),
            ..Default::default()
        })
        .await
        .unwrap()
        .info;
    let idle = m
        .create(CreateSandboxRequest {
            idle_timeout_secs: Some(5),
            ..Default::default()
        })
        .await
        .unwrap()
        .info;
    let keep = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let now = now_ms();
    assert!(m.reap(now).await.is_empty());

    // Idle: a call in flight keeps it alive; a call resets the clock.
    {
        let (_, _, _guard) = m.ready(&id_of(&idle)).await.unwrap();
        assert!(m.reap(now + 6_000).await.is_empty());
    }
    let done = m.reap(now_ms() + 6_000).await;
    assert_eq!(done, vec![(id_of(&idle), IDLE_TIMEOUT)]);
    assert!(rt.instance(&idle.id).destroyed.load(Ordering::SeqCst));

    let done = m.reap(now + 11_000).await;
    assert_eq!(done, vec![(id_of(&ttl), TTL_EXPIRED)]);
    let e = m.get(&id_of(&ttl)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound);
    assert!(e.to_string().contains(TTL_EXPIRED), "{e}");
    assert_eq!(m.list(&ListFilter::default()).len(), 1);
    assert!(m.get(&id_of(&keep)).is_ok());
    assert!(m.inner.store.load().unwrap().sandboxes.len() == 1);
}

#[tokio::test]
async fn a_dead_agent_marks_the_sandbox_failed_until_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let info = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let id = id_of(&info);
    rt.instance(&info.id).kill_agent();
    let mut state = SandboxState::Running;
    for _ in 0..200 {
        state = m.get(&id).unwrap().state;
        if state == SandboxState::Failed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(state, SandboxState::Failed);
    let got = m.get(&id).unwrap();
    assert_eq!(got.reason.as_deref(), Some(AGENT_EXITED));
    assert!(rt.instance(&info.id).destroyed.load(Ordering::SeqCst));
    assert_eq!(
        m.inner.store.load().unwrap().sandboxes[0].info.state,
        SandboxState::Failed
    );
    let e = m
        .procs()
        .exec(&id, ExecRequest::argv(["true"]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxLost);
    assert_eq!(
        m.list(&ListFilter {
            state: Some(SandboxState::Failed),
            ..Default::default()
        })
        .len(),
        1
    );
    m.delete(&id).await.unwrap();
    assert_eq!(m.count(), 0);
    assert_eq!(rt.destroyed_records.lock().unwrap()[0].0, id);
}

#[tokio::test]
async fn recovery_adopts_or_tears_down_and_never_leaks() {
    let dir = tempfile::tempdir().unwrap();
    let rt = Arc::new(crate::testing::FakeRuntime::default());
    let (a, b) = {
        let m = manager_with(dir.path(), rt.clone(), |_| {});
        let a = m
            .create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info;
        let b = m
            .create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info;
        (id_of(&a), id_of(&b))
    };

    // First restart: adoption works.
    {
        let m = manager_with(dir.path(), rt.clone(), |_| {});
        let report = m.recover().await.unwrap();
        let mut adopted = report.adopted.clone();
        adopted.sort();
        // Ids made in the same millisecond do not sort in creation order.
        let mut expected = vec![a.clone(), b.clone()];
        expected.sort();
        assert_eq!(adopted, expected);
        assert_eq!(report.orphans_removed, ["cgroup warren-n1/stray"]);
        assert_eq!(m.get(&a).unwrap().state, SandboxState::Running);
        let out = m
            .procs()
            .exec(&a, ExecRequest::argv(["true"]))
            .await
            .unwrap();
        assert_eq!(out.exit_code, Some(3));
        m.shutdown();
    }

    // Second restart: adoption fails; each is torn down by record and kept as failed.
    rt.fail_adopt.store(true, Ordering::SeqCst);
    let m = manager_with(dir.path(), rt.clone(), |_| {});
    let report = m.recover().await.unwrap();
    assert!(report.adopted.is_empty());
    assert_eq!(report.failed.len(), 2);
    let destroyed: Vec<SandboxId> = rt
        .destroyed_records
        .lock()
        .unwrap()
        .iter()
        .map(|(i, _)| i.clone())
        .collect();
    assert!(destroyed.contains(&a) && destroyed.contains(&b));
    assert!(rt
        .destroyed_records
        .lock()
        .unwrap()
        .iter()
        .all(|(_, r)| r.is_some()));
    let got = m.get(&a).unwrap();
    assert_eq!(got.state, SandboxState::Failed);
    assert!(got.reason.unwrap().contains("re-adopt"));
    // Nothing adopted, so reconcile is told no sandbox is known.
    assert_eq!(
        rt.reconciled.lock().unwrap().last().unwrap(),
        &Vec::<SandboxId>::new()
    );
    assert_eq!(
        m.inner
            .store
            .load()
            .unwrap()
            .sandboxes
            .iter()
            .filter(|s| s.info.state == SandboxState::Failed)
            .count(),
        2
    );
}

#[tokio::test]
async fn exec_merges_sandbox_defaults_and_encodes_output() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let req = CreateSandboxRequest {
        env: labels(&[("A", "sandbox"), ("B", "sandbox")]),
        workdir: Some("/work/./x".into()),
        user: Some("1000".into()),
        ..Default::default()
    };
    let id = id_of(&m.create(req).await.unwrap().info);

    let mut exec = ExecRequest::shell("echo hi");
    exec.env = labels(&[("B", "request")]);
    exec.timeout_secs = Some(1.5);
    exec.max_output_bytes = Some(100);
    let r = m.procs().exec(&id, exec).await.unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.stderr, "err");
    assert_eq!(r.duration_ms, 1.5);
    let spec: warren_proto::ExecSpec = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(spec.argv, ["/bin/sh", "-c", "echo hi"]);
    assert_eq!(
        spec.env,
        vec![
            ("A".into(), "sandbox".into()),
            ("B".into(), "request".into())
        ]
    );
    assert_eq!(spec.cwd.as_deref(), Some("/work/x"));
    assert_eq!(spec.user.as_deref(), Some("1000"));
    assert_eq!(spec.timeout_ms, Some(1500));
    assert_eq!(spec.output_cap, 100);

    let mut exec = ExecRequest::argv(["cat"]);
    exec.cwd = Some("/tmp".into());
    exec.user = Some("root".into());
    exec.stdin = Some("input".into());
    exec.encoding = OutputEncoding::Base64;
    let r = m.procs().exec(&id, exec).await.unwrap();
    assert_eq!(r.encoding, OutputEncoding::Base64);
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(&r.stdout)
        .unwrap();
    assert!(raw.ends_with(b"input"));
    let spec: warren_proto::ExecSpec = serde_json::from_slice(&raw[..raw.len() - 5]).unwrap();
    assert_eq!(spec.cwd.as_deref(), Some("/tmp"));
    assert_eq!(spec.user.as_deref(), Some("root"));
    assert!(spec.stdin);
    assert_eq!(r.stderr, "ZXJy");
    assert_eq!(m.parts().telemetry.metrics().execs.get(), 2);

    let bad = ExecRequest::default();
    assert_eq!(
        m.procs().exec(&id, bad).await.unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
}

#[tokio::test]
async fn streamed_exec_ends_with_exit() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    let mut events = m
        .procs()
        .exec_stream(&id, ExecRequest::argv(["x"]))
        .await
        .unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = events.next().await {
        seen.push(ev);
    }
    assert!(matches!(
        seen.first(),
        Some(warren_types::ExecEvent::Stdout { .. })
    ));
    match seen.last() {
        Some(warren_types::ExecEvent::Exit { result }) => {
            assert_eq!(result.exit_code, Some(3));
            assert!(result.stdout.is_empty());
        }
        other => panic!("last event {other:?}"),
    }
}

#[tokio::test]
async fn processes_and_files_reach_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id = id_of(
        &m.create(CreateSandboxRequest::default())
            .await
            .unwrap()
            .info,
    );
    // `spawn` is not exercised: AgentConn::spawn waits for a final event after `started`,
    // which the agent never sends (see the runtime's agent connection).
    let mut with_stdin = ExecRequest::argv(["cat"]);
    with_stdin.stdin = Some("x".into());
    assert_eq!(
        m.procs().spawn(&id, with_stdin).await.unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    assert_eq!(m.procs().get_proc(&id, 42).await.unwrap().pid, 42);
    assert_eq!(
        m.procs().get_proc(&id, 43).await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        m.procs()
            .wait_proc(&id, 42, Some(0.1))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::Timeout
    );
    m.procs().kill_proc(&id, 42, 15, None).await.unwrap();
    assert_eq!(
        m.procs()
            .kill_proc(&id, 42, 0, None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::InvalidRequest
    );

    assert_eq!(m.files().stat(&id, "/a/../b").await.unwrap().name, "/b");
    assert_eq!(
        m.files().stat(&id, "/missing").await.unwrap_err().code(),
        ErrorCode::NotFound
    );
    assert_eq!(
        m.files().stat(&id, "/../etc").await.unwrap_err().code(),
        ErrorCode::InvalidPath
    );
    assert_eq!(
        m.files()
            .remove(&id, "/", true, None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::InvalidPath
    );
    let chunks = futures::stream::iter(
        (0..3).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"abc"))),
    );
    m.files()
        .write_file(&id, "/f", Some(0o644), None, None, chunks)
        .await
        .unwrap();
    let mut dl = m.files().read_file(&id, "/f").await.unwrap();
    assert_eq!(dl.next().await.unwrap().unwrap(), "abcabcabc");
    assert!(dl.next().await.is_none());
    m.files().mkdir(&id, "/d", true, None, None).await.unwrap();
    m.files().chmod(&id, "/d", 0o755, None).await.unwrap();
    assert_eq!(
        m.files()
            .chmod(&id, "/d", 0o17777, None)
            .await
            .unwrap_err()
            .code(),
        ErrorCode::InvalidRequest
    );
    let page = m.files().list_dir(&id, "/d", None, None).await.unwrap();
    assert_eq!((page.entries.len(), page.next), (1, None));
    for (after, limit) in [(Some("a/b"), None), (Some(""), None), (None, Some(0))] {
        assert_eq!(
            m.files()
                .list_dir(&id, "/d", after, limit)
                .await
                .unwrap_err()
                .code(),
            ErrorCode::InvalidRequest
        );
    }
}

#[tokio::test]
async fn unknown_sandboxes_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let id: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
    assert_eq!(m.get(&id).unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(m.delete(&id).await.unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(
        m.procs()
            .exec(&id, ExecRequest::argv(["true"]))
            .await
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
}
