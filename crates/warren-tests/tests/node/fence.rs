//! A revived sandbox fences its original: two nodes share a trajectory store; the first is
//! killed (SIGKILL, its sandbox keeps running), the second revives the sandbox from the store,
//! and when the first comes back it deletes the original instead of resuming it beside its
//! copy, and says why in its log. The original never runs another step. A sandbox whose node
//! died right after its create answered (before any step was shipped) is revived the same way,
//! and so is a fork's child whose node died right after the fork answered: it comes back with
//! the files it was forked with.

use std::time::Duration;

use warren_client::{ExecRequest, ForkRequest};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_child_whose_node_died_right_after_the_fork_is_revived() {
    let store = StoreDir::new("fence-fork-store");
    let args = store.args();
    let Some(mut a) = Daemon::start_with(|_| args.clone()).await else {
        return;
    };
    let Some(b) = Daemon::start_with(|_| args).await else {
        return;
    };
    let parent = a.sandbox().await;
    let r = a
        .exec(&parent, &step("echo forked-with > /root/made", 1))
        .await;
    assert!(r.success(), "{r:?}");
    let fork = ForkRequest {
        n: 1,
        labels: Default::default(),
    };
    let children = a.client().fork(&parent, &fork).await.expect("fork");
    let child = children[0].id.clone();
    // The fork answered: the child's record is in the store already.
    let record = store
        .0
        .join("trajectories")
        .join(&child)
        .join("sandbox.json");
    assert!(
        record.exists(),
        "no record of {child} in the store when its fork answered"
    );
    let pids = a.sandbox_pids(&child);
    assert!(!pids.is_empty());

    // Its node dies at once. Whatever of the child's own log reached the store is taken
    // out: the store as it is when the node died before shipping any of it.
    a.kill9();
    if let Ok(rd) = std::fs::read_dir(store.0.join("trajectories").join(&child)) {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().ends_with(".jsonl") {
                std::fs::remove_file(e.path()).expect("removing a segment");
            }
        }
    }
    // Another node revives it with the files it was forked with; no step of its own.
    let revived = b.client().revive(&child, false).await.expect("revive");
    let new = revived.sandbox.id.clone();
    assert_eq!(revived.steps_replayed, 0, "{revived:?}");
    let r = b.exec(&new, &step("cat /root/made", 1)).await;
    assert_eq!(r.stdout.trim(), "forked-with", "{r:?}");

    // The first node comes back without the original child; its parent was not revived.
    a.spawn().await;
    let list = a.list().await;
    assert!(
        list.iter().all(|s| s.id != child),
        "the original is back beside its revived copy: {list:?}"
    );
    assert_original_gone(&a, &pids, None).await;
    b.client().delete(&new).await.expect("deleting the copy");
    a.client()
        .delete(&parent)
        .await
        .expect("deleting the parent");
}
