//! A node killed with SIGKILL: calls to its sandboxes fail at once (503 `node_unreachable`),
//! then with 410 `sandbox_lost` once its lease expired; new sandboxes go to the others; the
//! node restarted with the same id registers again and its sandboxes answer again.

use std::time::{Duration, Instant};

use warren_client::{CreateSandboxRequest, ExecRequest};
use warren_types::NodeState;

use crate::harness::{http, Cluster, GatewayProc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_fails_fast_then_lost_then_returns() {
    let Some(mut c) = Cluster::start(3, 2, |_| Vec::new()).await else {
        return;
    };
    let req = CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    };
    let mut ids = Vec::new();
    for i in 0..9 {
        ids.push(c.gw(i % 2).create(&req).await.unwrap().id);
    }
    let spread = c.by_node(&ids);
    let (&victim, theirs) = spread.iter().next().expect("some node has sandboxes");
    let id = theirs[0].clone();
    c.gw(0)
        .write_file_bytes(&id, "/tmp/mark", None, &b"before"[..])
        .await
        .unwrap();

    // SIGKILL: no goodbye to etcd, the lease runs out by itself.
    c.nodes[victim].kill9();
    let killed = Instant::now();

    // Every gateway notices; calls meanwhile fail fast (503), then 410.
    let gateways: Vec<String> = c.gateways.iter().map(|g| g.url()).collect();
    let loss = warren_gateway::bench::loss_detection(
        &gateways,
        &c.nodes[victim].node,
        &id,
        killed,
        Duration::from_secs(30),
    )
    .await
    .expect("every gateway notices the loss");
    println!(
        "node loss after kill -9: {}",
        serde_json::to_string(&loss).unwrap()
    );
    assert_eq!(
        loss.call_statuses.first(),
        Some(&503),
        "before the lease expires: node_unreachable ({:?})",
        loss.call_statuses
    );
    assert_eq!(
        loss.call_statuses.last(),
        Some(&410),
        "{:?}",
        loss.call_statuses
    );
    // "At once": far below any client timeout (loose bound: this machine is shared).
    assert!(
        loss.call_fail_max_ms < 1000.0,
        "a call to the dead node took {} ms to fail",
        loss.call_fail_max_ms
    );
    let (status, body) = http(
        c.gateways[1].port,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        r#"{"argv":["true"]}"#,
    )
    .await;
    assert_eq!(status, 410, "{body}");
    assert!(body.contains("sandbox_lost"), "{body}");

    // New sandboxes go to the others.
    for i in 0..4 {
        let sb = c.gw(i % 2).create(&req).await.unwrap();
        assert_ne!(c.owner(&sb.id), victim, "placed on the lost node");
        ids.push(sb.id);
    }

    // A gateway started after the loss knows the node too: 410, not 404.
    let late = GatewayProc::start(&c.etcd.endpoints()).await;
    let (status, body) = http(late.port, "GET", &format!("/v1/sandboxes/{id}"), "").await;
    assert_eq!(status, 410, "a gateway started later: {body}");
    assert_eq!(
        late.node_state(&c.nodes[victim].node).await,
        Some(NodeState::Lost)
    );
    // Forgotten, its sandboxes are unknown everywhere; a registered node is never forgotten.
    let live = c.nodes[(victim + 1) % 3].node.clone();
    assert_eq!(
        c.gw(0).forget_node(&live).await.unwrap_err().code(),
        Some(warren_client::ErrorCode::Conflict)
    );
    c.gw(0).forget_node(&c.nodes[victim].node).await.unwrap();
    for port in [late.port, c.gateways[1].port] {
        let started = Instant::now();
        loop {
            let (status, body) = http(port, "GET", &format!("/v1/sandboxes/{id}"), "").await;
            if status == 404 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "still {status} after forget: {body}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(late);

    // The node comes back with the same id: it re-adopts its sandboxes and registers again.
    c.nodes[victim].spawn().await;
    c.wait_node(victim, NodeState::Ready, Duration::from_secs(20))
        .await;
    let r = c
        .gw(1)
        .exec(&id, &ExecRequest::shell("cat /tmp/mark"))
        .await
        .expect("the sandbox answers again through the gateway");
    assert_eq!(r.stdout, "before", "the same sandbox, not another");
}

/// A node whose id is still registered (its previous run's lease has not run out: a restart
/// right after a SIGKILL) serves, and waits for that registration to go before it joins.
/// Stopped meanwhile (SIGTERM), it stops as it does once joined: it says so, exits with
/// success and takes its empty parent cgroups with it. (The signal's default action used to
/// kill it there, leaving them behind.) The stale registration is held here by a member of
/// the test's own, so the wait lasts until the node gives up (7 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_while_it_waits_to_join_stops_cleanly() {
    let Some(mut c) = Cluster::start(1, 0, |_| Vec::new()).await else {
        return;
    };
    let req = CreateSandboxRequest {
        memory_mb: Some(64),
        ..Default::default()
    };
    let node = &mut c.nodes[0];
    let sb = node.client().create(&req).await.unwrap();
    node.client().delete(&sb.id).await.unwrap();
    assert!(node.stop().await.success());
    let record = stale_record(&node.node);
    let holder = warren_cluster::Membership::start(
        warren_cluster::MemberConfig::new(warren_cluster::etcd::parse_endpoints(
            &c.etcd.endpoints(),
        )),
        std::sync::Arc::new(move || record.clone()),
    );
    assert_eq!(
        holder.wait_registered(Duration::from_secs(10)).await,
        Ok(true)
    );

    node.spawn().await;
    let sb = node.client().create(&req).await.unwrap();
    node.client().delete(&sb.id).await.unwrap();
    let status = node.stop().await;
    let log = node.log_tail(40);
    assert!(
        status.success(),
        "warrend exited with {status}; log:\n{log}"
    );
    assert!(
        log.contains("stopping while joining the cluster"),
        "not stopped while it waited to join; log:\n{log}"
    );
    let left: Vec<_> = crate::common::node_cgroup_dirs(&node.node)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(left.is_empty(), "parent cgroups left behind: {left:?}");
    holder.leave(Duration::from_secs(1)).await;
}

/// A registration of node `id` by another incarnation.
fn stale_record(id: &str) -> warren_types::NodeRecord {
    warren_types::NodeRecord {
        format: warren_types::NODE_RECORD_FORMAT,
        id: id.parse().unwrap(),
        incarnation: "stale".into(),
        address: "http://127.0.0.1:9".into(),
        version: "test".into(),
        started_at_ms: 0,
        substrates: vec![warren_types::Substrate::Container],
        capacity: Default::default(),
        load: Default::default(),
        pools: vec![],
        images: Default::default(),
        layers: vec![],
        blob_store: false,
    }
}
