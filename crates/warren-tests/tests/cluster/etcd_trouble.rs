//! etcd in trouble: the leader killed (a new one is elected and extends every lease: no node
//! may be marked lost, creates go on) and quorum lost (gateways route and place on their last
//! view, nodes serve; both recover by themselves when etcd is back). All along, calls go
//! through both gateways to a sandbox on every node, and sandboxes are created and deleted:
//! every node stays alive, so every call succeeds (none answers 410 `sandbox_lost`). Each
//! node keeps its registration (the same lease) through both outages, and after etcd is back
//! every gateway shows every node ready for a while (a registration that ends late, or a watch
//! that does not recover, shows there).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warren_client::{Client, CreateSandboxRequest, ExecRequest};
use warren_types::NodeState;

use crate::etcd::EtcdCluster;
use crate::harness::Cluster;

fn small() -> CreateSandboxRequest {
    CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    }
}

/// Asserts no gateway shows any node other than ready.
async fn assert_all_ready(c: &Cluster, when: &str) {
    for g in &c.gateways {
        for n in g.cluster().await.nodes {
            assert_eq!(
                n.state,
                NodeState::Ready,
                "{when}: gateway {} shows node {} {:?}\n{}",
                g.port,
                n.id,
                n.state,
                g.log_tail()
            );
        }
    }
}

/// Whether every gateway shows exactly the cluster's nodes, all ready, and whether every
/// gateway's watch is live.
async fn all_ready_and_connected(c: &Cluster) -> (bool, bool) {
    let mut want: Vec<String> = c.nodes.iter().map(|d| d.node.clone()).collect();
    want.sort();
    let (mut ready_all, mut connected) = (true, true);
    for g in &c.gateways {
        let info = g.cluster().await;
        let mut ready: Vec<String> = info
            .nodes
            .iter()
            .filter(|n| n.state == NodeState::Ready)
            .map(|n| n.id.to_string())
            .collect();
        ready.sort();
        ready_all &= info.nodes.len() == want.len() && ready == want;
        connected &= info.etcd_connected;
    }
    (ready_all, connected)
}

/// The lease of every node's key, by node (hex, as etcdctl prints it).
fn leases(etcd: &EtcdCluster) -> BTreeMap<String, i64> {
    let out = etcd
        .ctl(&["get", "/warren/nodes/", "--prefix", "-w", "json"])
        .expect("listing the node keys");
    let v: serde_json::Value = serde_json::from_str(&out).expect("etcdctl json");
    let mut m = BTreeMap::new();
    for kv in v["kvs"].as_array().cloned().unwrap_or_default() {
        let key = kv["key"].as_str().unwrap_or_default();
        let key = String::from_utf8(decode_base64(key)).expect("a utf-8 key");
        let node = key.trim_start_matches("/warren/nodes/").to_string();
        m.insert(node, kv["lease"].as_i64().unwrap_or(0));
    }
    m
}

/// etcdctl's JSON gives keys in base64.
fn decode_base64(s: &str) -> Vec<u8> {
    let table = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for v in s.bytes().filter_map(table) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// Calls through every gateway, over and over until stopped: an exec in a sandbox on every
/// node, and a create then delete. Every failure is kept, with what it was and when.
struct Traffic {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, Vec<String>)>,
}

impl Traffic {
    fn start(gateways: Vec<Client>, probes: Vec<String>) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut calls = 0u64;
            let mut failures = Vec::new();
            let failed = |what: String, why: String| {
                format!("{:.1}s {what}: {why}", started.elapsed().as_secs_f64())
            };
            while !stopped.load(Ordering::Relaxed) {
                for (g, gw) in gateways.iter().enumerate() {
                    for id in &probes {
                        calls += 1;
                        match gw.exec(id, &ExecRequest::shell("echo up")).await {
                            Ok(r) if r.stdout == "up\n" => {}
                            Ok(r) => failures
                                .push(failed(format!("exec in {id} via gw{g}"), format!("{r:?}"))),
                            Err(e) => failures
                                .push(failed(format!("exec in {id} via gw{g}"), e.to_string())),
                        }
                    }
                    calls += 1;
                    match gw.create(&small()).await {
                        Ok(sb) => {
                            calls += 1;
                            if let Err(e) = gw.delete(&sb.id).await {
                                failures.push(failed(
                                    format!("delete of {} via gw{g}", sb.id),
                                    e.to_string(),
                                ));
                            }
                        }
                        Err(e) => failures.push(failed(format!("create via gw{g}"), e.to_string())),
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (calls, failures)
        });
        Traffic { stop, task }
    }

    /// Stops the calls; how many were made and every failure.
    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the traffic task")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_and_quorum_lost() {
    let Some(mut c) = Cluster::start(3, 2, |_| Vec::new()).await else {
        return;
    };
    // A sandbox on every node (placement spreads them), called all along.
    let mut probes: BTreeMap<usize, String> = BTreeMap::new();
    let mut extra = Vec::new();
    for _ in 0..12 {
        if probes.len() == c.nodes.len() {
            break;
        }
        let id = c.gw(0).create(&small()).await.unwrap().id;
        match probes.entry(c.owner(&id)) {
            std::collections::btree_map::Entry::Vacant(e) => {
                e.insert(id);
            }
            std::collections::btree_map::Entry::Occupied(_) => extra.push(id),
        }
    }
    for id in extra {
        c.gw(0).delete(&id).await.unwrap();
    }
    assert_eq!(probes.len(), c.nodes.len(), "a sandbox on every node");
    let id = probes[&0].clone();
    let registered = leases(&c.etcd);
    assert_eq!(registered.len(), c.nodes.len(), "{registered:?}");
    let traffic = Traffic::start(
        c.gateways.iter().map(|g| g.client().clone()).collect(),
        probes.values().cloned().collect(),
    );

    // The leader dies: for more than two lease lifetimes, creates go on and nobody is lost.
    let leader = c.etcd.leader().expect("etcd has a leader");
    c.etcd.kill(leader);
    let started = Instant::now();
    let mut created = 0;
    while started.elapsed() < Duration::from_secs(8) {
        let sb = c
            .gw(created % 2)
            .create(&small())
            .await
            .expect("creates go on");
        created += 1;
        c.gw(1).delete(&sb.id).await.unwrap();
        assert_all_ready(&c, "etcd leader killed").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(created > 0);
    c.etcd.restart(leader);
    c.etcd.wait_healthy(Duration::from_secs(30));

    // Quorum lost: two of three members gone. Routing and placement go on.
    let others: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    c.etcd.kill(others[0]);
    c.etcd.kill(others[1]);
    let started = Instant::now();
    let mut made = Vec::new();
    while started.elapsed() < Duration::from_secs(8) {
        let r = c
            .gw(1)
            .exec(&id, &ExecRequest::shell("echo up"))
            .await
            .expect("routing goes on without etcd quorum");
        assert_eq!(r.stdout, "up\n");
        made.push(
            c.gw(made.len() % 2)
                .create(&small())
                .await
                .expect("placement goes on, on the last view")
                .id,
        );
        assert_all_ready(&c, "etcd quorum lost").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // etcd comes back: the gateways' watches and the nodes' leases recover by themselves,
    // and stay right: every gateway shows every node ready, continuously, for longer than a
    // lease lives (a registration that ends after etcd is back would show within it).
    c.etcd.restart(others[0]);
    c.etcd.restart(others[1]);
    c.etcd.wait_healthy(Duration::from_secs(30));
    let stable_for = Duration::from_secs(5);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready_since: Option<Instant> = None;
    let mut flaps = 0;
    loop {
        match all_ready_and_connected(&c).await {
            (true, true) => {
                if ready_since.get_or_insert_with(Instant::now).elapsed() >= stable_for {
                    break;
                }
            }
            // A watch that reconnects is not a node that goes.
            (true, false) => ready_since = None,
            (false, _) => flaps += usize::from(ready_since.take().is_some()),
        }
        assert!(
            Instant::now() < deadline,
            "the gateways did not show every node ready for {stable_for:?} after etcd came \
             back ({flaps} interruptions):\n{:#?}\n{}\n---\n{}\n---\nnode 0:\n{}",
            c.gateways[0].cluster().await,
            c.gateways[0].log_tail(),
            c.gateways[1].log_tail(),
            c.nodes[0].log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (calls, failures) = traffic.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {calls} calls to live nodes failed during etcd trouble:\n{}\n{}\n---\n{}",
        failures.len(),
        failures.join("\n"),
        c.gateways[0].log_tail(),
        c.gateways[1].log_tail()
    );
    assert_eq!(
        flaps, 0,
        "a node was not ready for a moment after etcd came back"
    );
    // No node gave up its registration: etcd kept every lease alive (a new leader extends
    // them), so each node kept renewing the same one.
    assert_eq!(
        leases(&c.etcd),
        registered,
        "every node kept its lease through the outages"
    );
    made.push(
        c.gw(0)
            .create(&small())
            .await
            .expect("a create after etcd is back")
            .id,
    );
    for m in made.into_iter().chain(probes.into_values()) {
        c.gw(0).delete(&m).await.unwrap();
    }
}
