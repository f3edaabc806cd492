//! Node loss during rollouts: two nodes share a trajectory store, 40 rollouts of 10 logged
//! steps run through a gateway, and one node is killed with SIGKILL part way through. Once the
//! gateway calls it lost, each of its rollouts is revived through the gateway (placed on the
//! live node, replayed from the store) and continued from the last step the store held, up to
//! its end; each finished rollout's file holds every step once. When the killed node comes
//! back, none of its originals is alive. The counts are printed (issue 42's numbers).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use warren_client::{Client, CreateSandboxRequest, ExecRequest};
use warren_types::NodeState;

use crate::common::{wait_for, StoreDir};
use crate::harness::Cluster;

const ROLLOUTS: usize = 40;
const STEPS: u64 = 10;

fn step(s: u64) -> ExecRequest {
    ExecRequest {
        step: Some(s),
        ..ExecRequest::shell(format!("echo {s} >> /root/runs; sleep 0.05; echo {s}"))
    }
}

/// Runs steps `from..=STEPS` of rollout `id`; answers the first step not answered (STEPS + 1
/// when all were).
async fn run(c: &Client, id: &str, from: u64, answered: &AtomicUsize) -> u64 {
    for s in from..=STEPS {
        match c.exec(id, &step(s)).await {
            Ok(r) if r.stdout == format!("{s}\n") => {
                answered.fetch_add(1, Ordering::Relaxed);
            }
            _ => return s,
        }
    }
    STEPS + 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_loss_during_rollouts_every_lost_rollout_is_revived_and_finished() {
    let store = StoreDir::new("rollouts-store");
    let shipping = store.args();
    let Some(mut c) = Cluster::start(2, 1, |_| shipping.clone()).await else {
        return;
    };
    let gw = c.gw(0).clone();
    let mut ids = Vec::new();
    for _ in 0..ROLLOUTS {
        let req = CreateSandboxRequest {
            memory_mb: Some(64),
            ..Default::default()
        };
        ids.push(gw.create(&req).await.expect("create").id);
    }
    let by_node = c.by_node(&ids);
    assert_eq!(
        by_node.len(),
        2,
        "the rollouts were not spread: {by_node:?}"
    );
    let victim = 0;
    let lost_ids = by_node[&victim].clone();
    let pids: Vec<u32> = lost_ids
        .iter()
        .flat_map(|id| c.nodes[victim].sandbox_pids(id))
        .collect();

    // Every rollout runs; the node dies about 40 % of the way through.
    let answered = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = ids
        .iter()
        .map(|id| {
            let (gw, id, answered) = (gw.clone(), id.clone(), answered.clone());
            tokio::spawn(async move { run(&gw, &id, 1, &answered).await })
        })
        .collect();
    let at = ROLLOUTS * STEPS as usize * 2 / 5;
    let reached = wait_for(Duration::from_secs(120), || async {
        (answered.load(Ordering::Relaxed) >= at).then_some(())
    })
    .await;
    assert!(reached.is_some(), "the rollouts did not get going");
    c.nodes[victim].kill9();
    let mut stopped = Vec::new();
    for t in tasks {
        stopped.push(t.await.unwrap());
    }
    for (id, s) in ids.iter().zip(&stopped) {
        if !lost_ids.contains(id) {
            assert_eq!(
                *s,
                STEPS + 1,
                "rollout {id} on the live node stopped at {s}"
            );
        }
    }
    let cut_short = lost_ids
        .iter()
        .filter(|id| stopped[ids.iter().position(|i| i == *id).unwrap()] <= STEPS)
        .count();

    // The gateway calls the node lost; each of its rollouts is revived and continued.
    c.wait_node(victim, NodeState::Lost, Duration::from_secs(60))
        .await;
    let mut copies = Vec::new();
    let mut finished = 0;
    for id in &lost_ids {
        let r = gw
            .revive(id, false)
            .await
            .expect("revive through the gateway");
        assert_eq!(r.divergences, 0, "{r:?}");
        let new = r.sandbox.id.clone();
        assert_ne!(c.owner(&new), victim);
        let from = r.last_step.unwrap_or(0) + 1;
        let end = run(&gw, &new, from, &AtomicUsize::new(0)).await;
        assert_eq!(end, STEPS + 1, "revived rollout {new} stopped at {end}");
        let runs = gw
            .exec(&new, &ExecRequest::shell("cat /root/runs"))
            .await
            .expect("reading the runs");
        let want: String = (1..=STEPS).map(|s| format!("{s}\n")).collect();
        assert_eq!(runs.stdout, want, "revived rollout {new} of {id}");
        finished += 1;
        copies.push(new);
    }

    // The node comes back: none of its originals is alive.
    c.nodes[victim].spawn().await;
    c.wait_node(victim, NodeState::Ready, Duration::from_secs(60))
        .await;
    let listed = c.nodes[victim].list().await;
    let alive = lost_ids
        .iter()
        .filter(|id| listed.iter().any(|s| &&s.id == id))
        .count();
    let left = wait_for(Duration::from_secs(30), || async {
        pids.iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .then_some(())
    })
    .await;
    println!(
        "node loss during {ROLLOUTS} rollouts x {STEPS} steps: {} on the lost node ({cut_short} cut short), {} revived, {finished} finished, {alive} originals alive afterwards",
        lost_ids.len(),
        copies.len()
    );
    assert_eq!(alive, 0, "originals back beside their copies");
    assert!(left.is_some(), "processes of the originals are left");
    assert_eq!(finished, lost_ids.len());
    for id in ids.iter().filter(|i| !lost_ids.contains(i)).chain(&copies) {
        gw.delete(id).await.expect("deleting a rollout");
    }
}
