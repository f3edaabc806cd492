//! Revive from a trajectory store (fake runtime): a sandbox shipped by one node and deleted
//! is revived by another node sharing the store, its inputs (stdin, uploads, inline or as
//! blobs) fed again; another tenant cannot; a segment sent again adds no entry; a store
//! without the sandbox's record answers `invalid_state`; a fork's child is revived from its
//! record and its parent's log when its own log never reached the store.

use std::sync::Arc;
use warren_blob::trajectory as shipped;
use warren_blob::BlobStore;
use warren_types::{Caller, ErrorCode, ExecRequest, Quotas, ReviveOptions, Role, SandboxId};

use crate::manager::Manager;
use crate::testing::manager_in;
use crate::testing::Calls as _;
use crate::trajectory::{LogSource, StoreLogSource, INLINE_MAX};

fn bytes_of(
    s: Vec<u8>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin {
    futures::stream::iter([Ok(bytes::Bytes::from(s))])
}

async fn episode(m: &Manager, caller: &Caller) -> SandboxId {
    let req = warren_types::CreateSandboxRequest {
        labels: [("task".to_string(), "t1".to_string())].into(),
        memory_mb: Some(300),
        ..Default::default()
    };
    let id: SandboxId = m
        .create_as(caller, req)
        .await
        .unwrap()
        .info
        .id
        .parse()
        .unwrap();
    let exec = |cmd: &str, step: u64, stdin: Option<String>| ExecRequest {
        step: Some(step),
        stdin,
        ..ExecRequest::shell(cmd)
    };
    m.procs().exec(&id, exec("echo hi", 1, None)).await.unwrap();
    let big = vec![b'u'; INLINE_MAX * 3];
    m.files()
        .write_file(&id, "/w/a", Some(0o640), None, Some(2), bytes_of(big))
        .await
        .unwrap();
    m.files()
        .mkdir(&id, "/w/d", true, None, Some(3))
        .await
        .unwrap();
    m.files().chmod(&id, "/w/a", 0o600, Some(4)).await.unwrap();
    m.files().remove(&id, "/w/d", true, Some(5)).await.unwrap();
    m.procs()
        .exec(&id, exec("cat", 6, Some("small".into())))
        .await
        .unwrap();
    let big_stdin = "s".repeat(INLINE_MAX * 2);
    m.procs()
        .exec(&id, exec("cat", 7, Some(big_stdin)))
        .await
        .unwrap();
    id
}

/// Every segment of `id` sent again as one (a shipper that forgot what it shipped).
async fn resend_all(store: &Arc<dyn BlobStore>, id: &SandboxId) {
    let (segs, _) = shipped::segments(store.as_ref(), id).await.unwrap();
    let mut lines = Vec::new();
    let mut header = None;
    for (_, _, key) in &segs {
        let (h, l) = shipped::decode_segment(key, &store.get(key).await.unwrap()).unwrap();
        header.get_or_insert(h);
        lines.extend(l);
    }
    let mut header = header.unwrap();
    header.first_seq = lines.first().unwrap().entry.seq;
    header.last_seq = lines.last().unwrap().entry.seq;
    store
        .put(
            &shipped::segment_key(id, header.first_seq, header.last_seq),
            shipped::encode_segment(&header, &lines),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sandbox_revives_on_another_node_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> =
        Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
    let a = Caller::tenant("a", Role::User, Quotas::default());
    let old = {
        std::fs::create_dir_all(dir.path().join("n1")).unwrap();
        let (m, _rt) = manager_in(&dir.path().join("n1"), |_| {});
        m.parts()
            .trajectories
            .ship_trajectories(store.clone(), &m)
            .unwrap();
        let old = episode(&m, &a).await;
        // The delete ships what is left and seals the log.
        m.delete(&old).await.unwrap();
        old
    };
    assert!(store
        .list(&shipped::sandbox_prefix(&old))
        .await
        .unwrap()
        .contains(&shipped::record_key(&old)));
    resend_all(&store, &old).await;

    // The store as a log source: every entry once, with its inputs.
    let source = StoreLogSource::new(store.clone());
    let logged = source.sandbox(&old).await.unwrap().unwrap();
    assert_eq!(logged.info.tenant.as_deref(), Some("a"));
    assert_eq!(logged.info.limits.memory_mb, 300);
    assert!(logged.hostname.is_some());
    let page = source.page(&old, 1, 100).await.unwrap();
    let seqs: Vec<u64> = page.entries.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>(), "each entry once");
    assert!(!page.more);
    let inputs: Vec<usize> = page
        .entries
        .iter()
        .filter_map(|e| e.input.as_ref())
        .map(|i| i.bytes(&page.blobs).len())
        .collect();
    assert_eq!(inputs, [INLINE_MAX * 3, 5, INLINE_MAX * 2]);
    let head = source.page(&old, 3, 2).await.unwrap();
    assert_eq!(
        head.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [3, 4]
    );
    assert!(head.more);

    // Another node sharing the store revives it.
    std::fs::create_dir_all(dir.path().join("n2")).unwrap();
    let (m, rt) = manager_in(&dir.path().join("n2"), |_| {});
    m.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m)
        .unwrap();
    let b = Caller::tenant("b", Role::User, Quotas::default());
    let foreign = m
        .revive(&b, &old, ReviveOptions::default())
        .await
        .unwrap_err();
    assert_eq!(foreign.to_api().code, ErrorCode::NotFound);
    let r = m.revive(&a, &old, ReviveOptions::default()).await.unwrap();
    assert_eq!(
        (r.replayed, r.divergences, r.last_step),
        (7, 0, Some(7)),
        "{r:?}"
    );
    assert_eq!(r.sandbox.tenant.as_deref(), Some("a"));
    assert_eq!(r.sandbox.labels.get("task").map(String::as_str), Some("t1"));
    assert_eq!(rt.shared.execs.load(std::sync::atomic::Ordering::SeqCst), 3);

    // A store without the record (shipped by an older node): a clear refusal.
    std::fs::remove_file(dir.path().join("remote").join(shipped::record_key(&old))).unwrap();
    let m2 = {
        std::fs::create_dir_all(dir.path().join("n3")).unwrap();
        manager_in(&dir.path().join("n3"), |_| {}).0
    };
    m2.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m2)
        .unwrap();
    let e = m2
        .revive(&a, &old, ReviveOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.to_api().code, ErrorCode::InvalidState, "{e}");
}

/// A revive from the store fences the original: its node, back, deletes it (and keeps a
/// sandbox nobody revived).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_deletes_its_sandboxes_revived_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> =
        Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
    let a = Caller::tenant("a", Role::User, Quotas::default());
    std::fs::create_dir_all(dir.path().join("n1")).unwrap();
    let (m1, _rt1) = manager_in(&dir.path().join("n1"), |_| {});
    m1.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m1)
        .unwrap();
    let old = episode(&m1, &a).await;
    let kept = episode(&m1, &a).await;
    let started = std::time::Instant::now();
    while shipped::last_shipped(store.as_ref(), &old).await.unwrap() < 7 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the log was not shipped"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(shipped::revived(store.as_ref(), &old)
        .await
        .unwrap()
        .is_none());

    // Another node revives it from the store (its node is away, the original still runs).
    std::fs::create_dir_all(dir.path().join("n2")).unwrap();
    let (m2, _rt2) = manager_in(&dir.path().join("n2"), |_| {});
    m2.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m2)
        .unwrap();
    let r = m2.revive(&a, &old, ReviveOptions::default()).await.unwrap();
    let mark = shipped::revived(store.as_ref(), &old)
        .await
        .unwrap()
        .expect("the revive marks the original");
    assert_eq!(
        (mark.sandbox.as_str(), mark.revived_as.as_str()),
        (old.as_str(), r.sandbox.id.as_str())
    );

    // The original's node deletes it, and only it.
    let deleted = m1.parts().trajectories.delete_revived(&m1).await;
    assert_eq!(deleted, vec![(old.clone(), r.sandbox.id.clone())]);
    assert!(m1.get(&old).is_err());
    let step = ExecRequest {
        step: Some(8),
        ..ExecRequest::shell("echo again")
    };
    assert!(m1.procs().exec(&old, step).await.is_err());
    assert!(m1.get(&kept).is_ok());
    assert!(m1.parts().trajectories.delete_revived(&m1).await.is_empty());
}

/// A created sandbox's record is in the store when the create answers, so a sandbox whose
/// node died before its first step (nothing shipped yet) is revived elsewhere; a node that
/// cannot write the record refuses the create and keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_is_in_the_store_before_its_create_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn BlobStore> =
        Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
    let a = Caller::tenant("a", Role::User, Quotas::default());
    let req = warren_types::CreateSandboxRequest {
        labels: [("task".to_string(), "t2".to_string())].into(),
        memory_mb: Some(200),
        ..Default::default()
    };
    std::fs::create_dir_all(dir.path().join("n1")).unwrap();
    let (m1, _rt1) = manager_in(&dir.path().join("n1"), |_| {});
    m1.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m1)
        .unwrap();
    let old: SandboxId = m1
        .create_as(&a, req)
        .await
        .unwrap()
        .info
        .id
        .parse()
        .unwrap();
    // Read at once: the shipper has nothing to ship for a sandbox without entries.
    let logged = StoreLogSource::new(store.clone())
        .sandbox(&old)
        .await
        .unwrap()
        .expect("the record is in the store when the create answers");
    assert_eq!(logged.info.limits.memory_mb, 200);

    // Its node is gone (never to ship anything); another node revives it.
    drop(m1);
    std::fs::create_dir_all(dir.path().join("n2")).unwrap();
    let (m2, _rt2) = manager_in(&dir.path().join("n2"), |_| {});
    m2.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m2)
        .unwrap();
    let r = m2.revive(&a, &old, ReviveOptions::default()).await.unwrap();
    assert_eq!((r.replayed, r.last_step), (0, None), "{r:?}");
    assert_eq!(r.sandbox.labels.get("task").map(String::as_str), Some("t2"));
    assert_eq!(r.sandbox.tenant.as_deref(), Some("a"));

    // A store that cannot be written: the create fails and leaves nothing on the node.
    let broken = dir.path().join("broken");
    std::fs::write(&broken, b"not a directory").unwrap();
    std::fs::create_dir_all(dir.path().join("n3")).unwrap();
    let (m3, _rt3) = manager_in(&dir.path().join("n3"), |_| {});
    m3.parts()
        .trajectories
        .ship_trajectories(Arc::new(warren_blob::LocalStore::new(broken)), &m3)
        .unwrap();
    let e = m3
        .create_as(&a, warren_types::CreateSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.to_api().code, ErrorCode::StartFailed, "{e}");
    assert!(e.to_string().contains("trajectory store"), "{e}");
    assert!(m3.list(&Default::default()).is_empty());
}

/// Removes the segments of `id` from the store at `remote`: the store as it was before they
/// were shipped.
fn unship(remote: &std::path::Path, id: &SandboxId) {
    let dir = remote.join(shipped::sandbox_prefix(id));
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".jsonl") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
}

/// A fork's child is in the store before the fork answers, naming its parent, whose log is
/// shipped up to the fork: a child whose node died before its own first entry was shipped
/// is revived elsewhere with the parent's files; when the parent's log does not reach the
/// fork, the revive says so (`invalid_state`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_child_is_in_the_store_before_the_fork_answers() {
    let dir = tempfile::tempdir().unwrap();
    let remote = dir.path().join("remote");
    let store: Arc<dyn BlobStore> = Arc::new(warren_blob::LocalStore::new(&remote));
    let a = Caller::tenant("a", Role::User, Quotas::default());
    std::fs::create_dir_all(dir.path().join("n1")).unwrap();
    let (m1, _rt1) = manager_in(&dir.path().join("n1"), |_| {});
    m1.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m1)
        .unwrap();
    let parent: SandboxId = m1
        .create_as(&a, Default::default())
        .await
        .unwrap()
        .info
        .id
        .parse()
        .unwrap();
    let made = ExecRequest {
        step: Some(1),
        ..ExecRequest::shell("echo made > /made")
    };
    m1.procs().exec(&parent, made).await.unwrap();
    let fork = warren_types::ForkRequest {
        n: 1,
        labels: Default::default(),
    };
    let child: SandboxId = m1.fork(&parent, fork).await.unwrap()[0].id.parse().unwrap();
    // When the fork answered: the child's record names the parent, whose step is shipped.
    let record: shipped::SandboxRecord =
        serde_json::from_slice(&store.get(&shipped::record_key(&child)).await.unwrap()).unwrap();
    assert_eq!(
        record.forked_from,
        Some(shipped::ForkOrigin {
            parent: parent.to_string(),
            parent_seq: 1
        })
    );
    assert!(
        shipped::last_shipped(store.as_ref(), &parent)
            .await
            .unwrap()
            >= 1
    );
    // The store as it was when the node died before the child's own log was shipped.
    let started = std::time::Instant::now();
    while shipped::last_shipped(store.as_ref(), &child).await.unwrap() < 1 {
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    unship(&remote, &child);

    // Another node revives the child: the parent's exec runs again, without its step.
    std::fs::create_dir_all(dir.path().join("n2")).unwrap();
    let (m2, rt2) = manager_in(&dir.path().join("n2"), |_| {});
    m2.parts()
        .trajectories
        .ship_trajectories(store.clone(), &m2)
        .unwrap();
    let r = m2
        .revive(&a, &child, ReviveOptions::default())
        .await
        .unwrap();
    assert_eq!(
        (r.replayed, r.steps_replayed, r.divergences),
        (1, 0, 0),
        "{r:?}"
    );
    assert_eq!(
        rt2.shared.execs.load(std::sync::atomic::Ordering::SeqCst),
        1
    );

    // A parent whose log does not reach the fork: the child's files cannot be made.
    unship(&remote, &parent);
    let e = m2
        .revive(&a, &child, ReviveOptions::default())
        .await
        .unwrap_err();
    assert_eq!(e.to_api().code, ErrorCode::InvalidState, "{e}");
    assert!(e.to_string().contains(parent.as_str()), "{e}");
}
