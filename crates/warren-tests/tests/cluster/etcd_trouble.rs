//! etcd in trouble: the leader killed (a new one is elected and extends every lease: no node
//! may be marked lost, creates go on) and quorum lost (gateways route and place on their last
//! view, nodes serve; both recover by themselves when etcd is back).

use std::time::{Duration, Instant};

use warren_client::{CreateSandboxRequest, ExecRequest};
use warren_types::NodeState;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_leader_killed_and_quorum_lost() {
    let Some(mut c) = Cluster::start(3, 2, |_| Vec::new()).await else {
        return;
    };
    let id = c.gw(0).create(&small()).await.unwrap().id;

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
    // etcd comes back: the gateways' watches and the nodes' leases recover by themselves.
    c.etcd.restart(others[0]);
    c.etcd.restart(others[1]);
    c.etcd.wait_healthy(Duration::from_secs(30));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut ok = true;
        for g in &c.gateways {
            let info = g.cluster().await;
            ok &= info.etcd_connected
                && info.nodes.len() == 3
                && info.nodes.iter().all(|n| n.state == NodeState::Ready);
        }
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gateways did not recover after etcd came back:\n{}",
            c.gateways[0].log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.gw(0).create(&small()).await.is_ok());
    for m in made {
        c.gw(0).delete(&m).await.unwrap();
    }
}
