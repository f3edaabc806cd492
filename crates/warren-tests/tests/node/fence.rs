//! A revived sandbox fences its original: two nodes share a trajectory store; the first is
//! killed (SIGKILL, its sandbox keeps running), the second revives the sandbox from the store,
//! and when the first comes back it deletes the original instead of resuming it beside its
//! copy, and says why in its log. The original never runs another step. A sandbox whose node
//! died right after its create answered (before any step was shipped) is revived the same way.

use std::time::Duration;

use warren_client::ExecRequest;

use crate::common::{assert_original_gone, shipped, wait_for, Daemon, StoreDir};

fn step(cmd: &str, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        ..ExecRequest::shell(cmd)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_comes_back_deletes_its_sandbox_revived_elsewhere() {
    let store = StoreDir::new("fence-store");
    let args = store.args();
    let Some(mut a) = Daemon::start_with(|_| args.clone()).await else {
        return;
    };
    let Some(b) = Daemon::start_with(|_| args).await else {
        return;
    };
    let id = a.sandbox().await;
    let r = a
        .exec(&id, &step("echo 1 >> /root/runs; wc -l < /root/runs", 1))
        .await;
    assert_eq!(r.stdout.trim(), "1", "{r:?}");
    let on_disk = wait_for(Duration::from_secs(30), || async {
        shipped(&store.0, &id, "/root/runs").then_some(())
    })
    .await;
    assert!(on_disk.is_some(), "step 1 of {id} was never shipped");
    let pids = a.sandbox_pids(&id);
    assert!(!pids.is_empty());

    // Its node dies; the sandbox keeps running there. Another node revives it.
    a.kill9();
    let revived = b.client().revive(&id, false).await.expect("revive");
    let new = revived.sandbox.id.clone();
    assert_eq!(revived.steps_replayed, 1, "{revived:?}");
    let r = b
        .exec(&new, &step("echo 1 >> /root/runs; wc -l < /root/runs", 2))
        .await;
    assert_eq!(r.stdout.trim(), "2", "{r:?}");

    // The first node comes back: the original is gone, not resumed.
    a.spawn().await;
    let list = a.list().await;
    assert!(
        list.iter().all(|s| s.id != id),
        "the original is back beside its revived copy: {list:?}"
    );
    let e = a
        .client()
        .exec(&id, &step("echo 1 >> /root/runs", 2))
        .await
        .expect_err("a step of the original");
    assert!(
        matches!(e.status(), Some(404) | Some(410)),
        "a step of the original answered {e}"
    );
    assert_original_gone(&a, &pids, Some(&new)).await;
    // The copy goes on.
    let r = b.exec(&new, &step("wc -l < /root/runs", 3)).await;
    assert_eq!(r.stdout.trim(), "2", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_whose_node_died_right_after_its_create_is_revived() {
    let store = StoreDir::new("fence-early-store");
    let args = store.args();
    let Some(mut a) = Daemon::start_with(|_| args.clone()).await else {
        return;
    };
    let Some(b) = Daemon::start_with(|_| args).await else {
        return;
    };
    let id = a.sandbox().await;
    // The create answered: its record is in the store already, nothing else is.
    let record = store.0.join("trajectories").join(&id).join("sandbox.json");
    assert!(
        record.exists(),
        "no record of {id} in the store when its create answered"
    );
    let pids = a.sandbox_pids(&id);
    assert!(!pids.is_empty());

    // Its node dies at once; another node revives it, no step to replay.
    a.kill9();
    let revived = b.client().revive(&id, false).await.expect("revive");
    let new = revived.sandbox.id.clone();
    assert_eq!(revived.steps_replayed, 0, "{revived:?}");
    let r = b
        .exec(&new, &step("echo 1 >> /root/runs; wc -l < /root/runs", 1))
        .await;
    assert_eq!(r.stdout.trim(), "1", "{r:?}");

    // The first node comes back without the original.
    a.spawn().await;
    let list = a.list().await;
    assert!(
        list.iter().all(|s| s.id != id),
        "the original is back beside its revived copy: {list:?}"
    );
    assert_original_gone(&a, &pids, None).await;
    b.client().delete(&new).await.expect("deleting the copy");
}
