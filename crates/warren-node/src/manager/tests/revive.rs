//! Revive (fake runtime): every changing call is run again with its input, steps continue,
//! forks are recorded and not made, tenants and quotas hold, and a log read from another
//! source revives a deleted sandbox.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use warren_types::{
    Caller, CreateSandboxRequest, ErrorCode, ExecRequest, ForkRequest, Quotas, ReviveOptions, Role,
    SandboxId, TrajectoryCall,
};

use crate::error::StoreError;
use crate::testing::manager_in;
use crate::testing::Calls as _;
use crate::trajectory::source::LoggedSandbox;
use crate::trajectory::{LogPage, LogSource};

use crate::manager::Manager;

fn bytes_of(
    s: &'static [u8],
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Unpin {
    futures::stream::iter([Ok(bytes::Bytes::from_static(s))])
}

fn step(cmd: &str, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

async fn episode(m: &Manager, caller: &Caller) -> SandboxId {
    let req = CreateSandboxRequest {
        labels: [("task".to_string(), "t1".to_string())].into(),
        memory_mb: Some(300),
        ..Default::default()
    };
    let info = m.create_as(caller, req).await.unwrap().info;
    let id: SandboxId = info.id.parse().unwrap();
    let with_stdin = ExecRequest {
        stdin: Some("fed in".into()),
        ..step("cat", 1)
    };
    m.procs().exec(&id, with_stdin).await.unwrap();
    m.files()
        .write_file(&id, "/w/a", Some(0o640), None, Some(2), bytes_of(b"abc"))
        .await
        .unwrap();
    m.files()
        .mkdir(&id, "/w/d", true, None, Some(3))
        .await
        .unwrap();
    m.files().chmod(&id, "/w/a", 0o600, Some(4)).await.unwrap();
    // A call without a step is replayed too.
    m.procs()
        .exec(&id, ExecRequest::shell("echo free"))
        .await
        .unwrap();
    m.files().remove(&id, "/w/d", true, Some(6)).await.unwrap();
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revive_runs_every_change_again_and_continues_the_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let old = episode(&m, &Caller::admin()).await;
    m.fork_step(
        &Caller::admin(),
        &old,
        ForkRequest {
            n: 1,
            labels: Default::default(),
        },
        Some(7),
    )
    .await
    .unwrap();
    let (execs, changes) = (
        rt.shared.execs.load(Ordering::SeqCst),
        rt.shared.changes.load(Ordering::SeqCst),
    );
    let sandboxes = m.count();

    let r = m
        .revive(&Caller::admin(), &old, ReviveOptions::default())
        .await
        .unwrap();
    assert_eq!(r.revived_from, old.to_string());
    assert_eq!((r.replayed, r.steps_replayed), (6, 5), "{r:?}");
    assert_eq!(r.divergences, 0, "{r:?}");
    assert_eq!(r.last_step, Some(7));
    assert_eq!(r.skipped, 1, "the fork is copied, not made");
    assert_eq!(
        m.count(),
        sandboxes + 1,
        "one new sandbox, no new fork child"
    );
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), execs + 2);
    assert_eq!(rt.shared.changes.load(Ordering::SeqCst), changes + 4);
    assert_eq!(r.sandbox.labels.get("task").map(String::as_str), Some("t1"));
    assert_eq!(r.sandbox.limits.memory_mb, 300);

    // The new log holds the same calls with the same steps and outcomes.
    let new: SandboxId = r.sandbox.id.parse().unwrap();
    let (a, b) = (
        m.entries(&old, 0).await.unwrap(),
        m.entries(&new, 0).await.unwrap(),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!((x.step, x.call.kind()), (y.step, y.call.kind()));
        assert_eq!(x.request_sha256, y.request_sha256);
        if x.call.kind() == "exec" {
            assert_eq!(
                x.result,
                y.result.as_ref().map(|r| {
                    let mut r = r.clone();
                    if let (
                        warren_types::TrajectoryResult::Exec(o),
                        Some(warren_types::TrajectoryResult::Exec(xo)),
                    ) = (&mut r, &x.result)
                    {
                        o.result.duration_ms = xo.result.duration_ms;
                    }
                    r
                })
            );
        }
    }
    assert!(
        matches!(&b.last().unwrap().call, TrajectoryCall::Fork { children, .. } if children.len() == 1)
    );

    // A trainer goes on with the same indices: old steps answer from the log, a lower step
    // with another request conflicts, the next step runs.
    let again = m.procs().exec(&new, step("cat", 1)).await;
    assert_eq!(
        again.unwrap_err().to_api().code,
        ErrorCode::StepConflict,
        "stdin differs"
    );
    let replayed = m
        .procs()
        .exec(
            &new,
            ExecRequest {
                stdin: Some("fed in".into()),
                ..step("cat", 1)
            },
        )
        .await
        .unwrap();
    assert!(replayed.replayed);
    assert!(m
        .files()
        .mkdir(&new, "/w/d", true, None, Some(3))
        .await
        .unwrap());
    let low = m
        .procs()
        .exec(&new, step("echo late", 5))
        .await
        .unwrap_err();
    assert_eq!(low.to_api().code, ErrorCode::StepConflict);
    assert!(
        !m.procs()
            .exec(&new, step("echo next", 8))
            .await
            .unwrap()
            .replayed
    );

    // stop_on_divergence with nothing diverging replays everything.
    let all = m
        .revive(
            &Caller::admin(),
            &old,
            ReviveOptions {
                stop_on_divergence: true,
            },
        )
        .await
        .unwrap();
    assert!(!all.stopped && all.replayed == 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_revives_its_own_tenants_sandboxes_only_within_its_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let quotas = Quotas {
        max_sandboxes: Some(2),
        ..Default::default()
    };
    let a = Caller::tenant("a", Role::User, quotas);
    let b = Caller::tenant("b", Role::User, Quotas::default());
    let old = episode(&m, &a).await;
    let refused = m
        .revive(&b, &old, ReviveOptions::default())
        .await
        .unwrap_err()
        .to_api();
    assert_eq!(refused.code, ErrorCode::NotFound);
    assert_eq!(m.count(), 1, "nothing was made for b");

    let r = m.revive(&a, &old, ReviveOptions::default()).await.unwrap();
    assert_eq!(r.sandbox.tenant.as_deref(), Some("a"));
    let over = m
        .revive(&a, &old, ReviveOptions::default())
        .await
        .unwrap_err()
        .to_api();
    assert_eq!(over.code, ErrorCode::QuotaExceeded);

    // An administrator's revive belongs to the old sandbox's tenant.
    let new: SandboxId = r.sandbox.id.parse().unwrap();
    m.delete(&new).await.unwrap();
    let by_admin = m
        .revive(&Caller::admin(), &old, ReviveOptions::default())
        .await
        .unwrap();
    assert_eq!(by_admin.sandbox.tenant.as_deref(), Some("a"));
}

/// Logs kept in memory, as a store the logs were shipped to would hold them.
#[derive(Default)]
struct Kept {
    sandbox: Mutex<Option<LoggedSandbox>>,
    entries: Mutex<Vec<crate::trajectory::StoredEntry>>,
    blobs: Mutex<crate::trajectory::Blobs>,
}

#[async_trait::async_trait]
impl LogSource for Kept {
    async fn sandbox(&self, id: &SandboxId) -> Result<Option<LoggedSandbox>, StoreError> {
        let s = self.sandbox.lock().unwrap().clone();
        Ok(s.filter(|s| s.info.id == id.to_string()))
    }

    async fn page(&self, _: &SandboxId, from: u64, limit: usize) -> Result<LogPage, StoreError> {
        let all = self.entries.lock().unwrap();
        let entries: Vec<_> = all
            .iter()
            .filter(|e| e.seq >= from)
            .take(limit)
            .cloned()
            .collect();
        Ok(LogPage {
            more: entries.len() == limit,
            entries,
            blobs: self.blobs.lock().unwrap().clone(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sandbox_revives_from_another_log_source() {
    let dir = tempfile::tempdir().unwrap();
    let (m, rt) = manager_in(dir.path(), |_| {});
    let a = Caller::tenant("a", Role::User, Quotas::default());
    let old = episode(&m, &a).await;
    let kept = Arc::new(Kept::default());
    {
        let (entries, blobs) = m.journal().read().unwrap().entries(&old, 0, 1000).unwrap();
        *kept.entries.lock().unwrap() = entries;
        *kept.blobs.lock().unwrap() = blobs;
        *kept.sandbox.lock().unwrap() = Some(LoggedSandbox {
            info: m.get(&old).unwrap(),
            hostname: None,
            forked_from: None,
        });
    }
    m.delete(&old).await.unwrap();
    let gone = m
        .revive(&a, &old, ReviveOptions::default())
        .await
        .unwrap_err();
    assert_eq!(
        gone.to_api().code,
        ErrorCode::NotFound,
        "no source holds it yet"
    );

    m.parts().trajectories.set_log_source(kept);
    let b = Caller::tenant("b", Role::User, Quotas::default());
    let foreign = m
        .revive(&b, &old, ReviveOptions::default())
        .await
        .unwrap_err();
    assert_eq!(foreign.to_api().code, ErrorCode::NotFound);
    let execs = rt.shared.execs.load(Ordering::SeqCst);
    let r = m.revive(&a, &old, ReviveOptions::default()).await.unwrap();
    assert_eq!((r.replayed, r.divergences, r.last_step), (6, 0, Some(6)));
    assert_eq!(rt.shared.execs.load(Ordering::SeqCst), execs + 2);
}

/// A lifetime extended past what a create may ask for (extend counts from now, not from the
/// sandbox's creation) is held to the node's bound in the revived sandbox, not refused.
#[tokio::test]
async fn a_revive_of_a_sandbox_whose_lifetime_grew_keeps_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _rt) = manager_in(dir.path(), |_| {});
    let max = warren_types::sandbox::LimitBounds::default().max_ttl_secs;
    let old = m
        .create_as(
            &Caller::admin(),
            CreateSandboxRequest {
                ttl_secs: Some(max),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let old: SandboxId = old.info.id.parse().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    m.extend(&old, max).await.unwrap();
    let r = m
        .revive(&Caller::admin(), &old, ReviveOptions::default())
        .await
        .expect("a revive of a sandbox whose lifetime was extended");
    let new = r.sandbox;
    let ttl = new.expires_at_ms.unwrap() - new.created_at_ms;
    assert!(ttl <= max * 1000, "{ttl}");
}
