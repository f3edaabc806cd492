//! Membership against a real etcd, without nodes: a quiet watch stays live; a second live
//! registration of one id is refused; a lease revoked behind the node's back is replaced by
//! itself; the view follows registrations, drains and departures, and lists again after a
//! compaction.

use std::sync::Arc;
use std::time::Duration;

use warren_cluster::{ClusterView, Keys, MemberConfig, MemberState, Membership};
use warren_types::{NodeCapacity, NodeLoad, NodeRecord, NodeState, Substrate, NODE_RECORD_FORMAT};

use crate::common::test_root;
use crate::etcd::{etcd_missing, EtcdCluster};

fn record(id: &str, incarnation: &str) -> NodeRecord {
    NodeRecord {
        format: NODE_RECORD_FORMAT,
        id: id.parse().unwrap(),
        incarnation: incarnation.into(),
        address: "http://127.0.0.1:9".into(),
        version: "test".into(),
        started_at_ms: 0,
        substrates: vec![Substrate::Container],
        capacity: NodeCapacity::default(),
        load: NodeLoad::default(),
        pools: vec![],
        images: Default::default(),
        layers: vec![],
        blob_store: false,
    }
}

fn member(endpoints: &str, keys: &Keys, rec: NodeRecord) -> Membership {
    let mut cfg = MemberConfig::new(warren_cluster::etcd::parse_endpoints(endpoints));
    cfg.keys = keys.clone();
    Membership::start(cfg, Arc::new(move || rec.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ids_refused_lost_leases_replaced_views_follow() {
    if etcd_missing().is_some() {
        println!("SKIP: {}", etcd_missing().unwrap());
        return;
    }
    std::fs::create_dir_all(test_root()).unwrap();
    let Some(etcd) = EtcdCluster::start(&test_root(), 3) else {
        return;
    };
    let endpoints = etcd.endpoints();
    let keys = Keys::new(&format!("/warren-test-{}", std::process::id()));
    let view = ClusterView::start(
        warren_cluster::etcd::parse_endpoints(&endpoints),
        keys.clone(),
    );
    let a = member(&endpoints, &keys, record("ma", "one"));
    assert_eq!(a.wait_registered(Duration::from_secs(10)).await, Ok(true));
    let id: warren_types::NodeId = "ma".parse().unwrap();
    assert!(
        view.wait_for(Duration::from_secs(5), |v| v.state(&id)
            == Some(NodeState::Ready))
            .await
    );

    // A quiet watch stays live: nothing changes for longer than etcd lets a connection
    // ping without answers, and the view never disconnects (it listed again every 4 s when
    // the client pinged every second and etcd closed the connection for "too many pings").
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < Duration::from_secs(10) {
        assert!(
            view.snapshot().connected,
            "the quiet watch was interrupted after {:?}",
            quiet.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Another incarnation with the same id: refused (after waiting out a possibly stale key).
    let b = member(&endpoints, &keys, record("ma", "two"));
    let refused = b.wait_registered(Duration::from_secs(15)).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|why| why.to_string().contains("one")),
        "{refused:?}"
    );
    drop(b);

    // The lease revoked behind the node's back: the key goes, the node registers again.
    let MemberState::Registered { lease } = a.state() else {
        panic!("a is {:?}", a.state())
    };
    etcd.ctl(&["lease", "revoke", &format!("{lease:x}")])
        .expect("revoking the lease");
    assert!(
        view.wait_for(Duration::from_secs(5), |v| v.state(&id)
            == Some(NodeState::Lost))
            .await,
        "the view saw the key go"
    );
    assert!(
        view.wait_for(Duration::from_secs(10), |v| v.state(&id)
            == Some(NodeState::Ready))
            .await,
        "the node registered again by itself"
    );
    // The member learns its new lease when its transaction answers, which may be a moment
    // after the view saw the key.
    let started = std::time::Instant::now();
    while !matches!(a.state(), MemberState::Registered { lease: l } if l != lease) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a is {:?} (old lease {lease:x})",
            a.state()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Drain marks show in the view.
    view.set_drain(&id, true).await.unwrap();
    assert_eq!(view.snapshot().state(&id), Some(NodeState::Draining));
    view.set_drain(&id, false).await.unwrap();
    assert_eq!(view.snapshot().state(&id), Some(NodeState::Ready));

    // A compaction past the watch makes the view list again; it stays right.
    let rev = view.snapshot().revision;
    etcd.ctl(&["compact", &rev.to_string()])
        .expect("compacting");
    let c = member(&endpoints, &keys, record("mc", "x"));
    assert_eq!(c.wait_registered(Duration::from_secs(10)).await, Ok(true));
    let idc: warren_types::NodeId = "mc".parse().unwrap();
    assert!(
        view.wait_for(Duration::from_secs(5), |v| v.state(&idc)
            == Some(NodeState::Ready)
            && v.state(&id) == Some(NodeState::Ready))
            .await
    );

    // Leaving removes the key at once.
    a.leave(Duration::from_secs(2)).await;
    c.leave(Duration::from_secs(2)).await;
    assert!(
        view.wait_for(Duration::from_secs(3), |v| v.live().count() == 0)
            .await,
        "{:?}",
        view.snapshot()
    );
    etcd.ctl(&["del", "--prefix", &keys.prefix()]);
}
