//! 200 creates, 32 in flight: all succeed, all run, all are deleted, nothing is left.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use warren_client::{CreateSandboxRequest, ExecRequest, SandboxState};

use crate::common::Daemon;

const SANDBOXES: usize = 200;
const IN_FLIGHT: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_200_creates() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client().clone();
    let labels: BTreeMap<String, String> = [("batch".to_string(), d.node.clone())].into();
    let sem = Arc::new(Semaphore::new(IN_FLIGHT));

    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..SANDBOXES {
        let (c, sem) = (c.clone(), sem.clone());
        let mut req = CreateSandboxRequest {
            labels: labels.clone(),
            memory_mb: Some(64),
            // 200 of the default 512 MiB are more than the default writable-layer space.
            disk_mb: Some(64),
            ..Default::default()
        };
        req.labels.insert("i".into(), i.to_string());
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            let t = Instant::now();
            c.create(&req).await.map(|info| (info, t.elapsed()))
        }));
    }
    let mut ids = Vec::new();
    let mut failures = Vec::new();
    let mut latencies = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        match t.await.unwrap() {
            Ok((info, took)) => {
                assert_eq!(info.state, SandboxState::Running, "{info:?}");
                ids.push(info.id);
                latencies.push(took);
            }
            Err(e) => failures.push(format!("create {i}: {e}")),
        }
    }
    let create_time = started.elapsed();
    latencies.sort();
    println!(
        "{} creates in {create_time:?} (p50 {:?}, max {:?})",
        ids.len(),
        latencies.get(latencies.len() / 2),
        latencies.last()
    );

    // Clean up whatever was made before judging, so a failure leaves nothing behind.
    let check = async {
        assert!(
            failures.is_empty(),
            "{} of {SANDBOXES} creates failed:\n{}\nlog:\n{}",
            failures.len(),
            failures.join("\n"),
            d.log_tail(20)
        );
        let unique: BTreeSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), SANDBOXES, "duplicate ids");
        let listed = c.list(&labels, None).await.unwrap();
        assert_eq!(listed.len(), SANDBOXES);
        // Every one of them really runs commands.
        let mut execs = Vec::new();
        for id in &ids {
            let (c, sem, id) = (c.clone(), sem.clone(), id.clone());
            execs.push(tokio::spawn(async move {
                let _permit = sem.acquire_owned().await.unwrap();
                let r = c
                    .exec(&id, &ExecRequest::argv(["cat", "/etc/hostname"]))
                    .await;
                (id, r)
            }));
        }
        for t in execs {
            let (id, r) = t.await.unwrap();
            let r = r.unwrap_or_else(|e| panic!("exec in {id}: {e}"));
            assert!(r.success(), "exec in {id}: {r:?}");
        }
    };
    // Run the checks, but delete before re-raising a failure.
    let checked = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(check)).await;

    let started = Instant::now();
    let mut deletes = Vec::new();
    for id in ids.clone() {
        let (c, sem) = (c.clone(), sem.clone());
        deletes.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await.unwrap();
            c.delete(&id).await.map_err(|e| format!("delete {id}: {e}"))
        }));
    }
    let mut delete_failures = Vec::new();
    for t in deletes {
        if let Err(e) = t.await.unwrap() {
            delete_failures.push(e);
        }
    }
    println!("{} deletes in {:?}", ids.len(), started.elapsed());
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
    assert!(
        delete_failures.is_empty(),
        "deletes failed:\n{}",
        delete_failures.join("\n")
    );
    let left = d.list().await;
    assert!(
        left.is_empty(),
        "sandboxes left after deleting all: {left:?}"
    );
    // No sandbox cgroups remain under the node's groups.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for dir in d.cgroup_dirs("") {
        let subs: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            subs.is_empty(),
            "{} still has groups {subs:?}",
            dir.display()
        );
    }
    assert!(
        create_time < Duration::from_secs(120),
        "creates took {create_time:?}"
    );
}
