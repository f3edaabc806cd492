use super::*;
use crate::view::{Member, View};
use std::collections::HashMap;
use warren_types::{NodeCapacity, NodeLoad, WarmPool, NODE_RECORD_FORMAT};

fn node(id: &str) -> NodeRecord {
    NodeRecord {
        format: NODE_RECORD_FORMAT,
        id: id.parse().unwrap(),
        incarnation: format!("{id}-1"),
        address: format!("http://{id}"),
        version: "0".into(),
        started_at_ms: 0,
        substrates: vec![Substrate::Container],
        capacity: NodeCapacity {
            max_sandboxes: 10_000,
            max_running: 10_000,
            max_starting: 64,
            memory_total_mb: 64 * 1024,
            min_free_memory_mb: 256,
            max_sandbox_memory_mb: 32 * 1024,
        },
        load: NodeLoad {
            memory_available_mb: 32 * 1024,
            ..Default::default()
        },
        pools: vec![],
        images: [(
            "default:latest".to_string(),
            vec!["sha256:base".to_string()],
        )]
        .into(),
        layers: vec!["sha256:base".into()],
        blob_store: false,
    }
}

fn view(nodes: Vec<NodeRecord>) -> View {
    let mut v = View {
        connected: true,
        ..Default::default()
    };
    for r in nodes {
        v.members.insert(
            r.id.clone(),
            Member {
                record: r,
                lost: false,
                mod_revision: 1,
            },
        );
    }
    v
}

fn req() -> PlaceRequest {
    PlaceRequest {
        substrate: Substrate::Container,
        image: vec!["default".into()],
        memory_mb: 512,
        key: None,
        call: false,
    }
}

fn none(_: &NodeId) -> u64 {
    0
}

#[test]
fn filters_say_what_excluded_how_many() {
    let mut vm = node("a");
    vm.substrates.push(Substrate::Vm);
    let mut v = view(vec![vm, node("b"), node("c")]);
    let mut r = req();
    r.substrate = Substrate::Vm;
    // Only a serves vm; drained, it can serve none for now.
    v.drained.insert("a".parse().unwrap());
    match candidates(&v, &r, &none, 1, 2) {
        Err(PlaceError::Unavailable(msg, ex)) => {
            assert_eq!(ex.substrate, 2);
            assert_eq!(ex.draining, 1);
            assert!(msg.contains("2 nodes do not serve substrate vm"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Nobody has the image: never placeable.
    let v = view(vec![node("a"), node("b")]);
    let mut r = req();
    r.image = vec!["nope:1".into()];
    match candidates(&v, &r, &none, 1, 2) {
        Err(PlaceError::Unschedulable(msg, ex)) => {
            assert_eq!(ex.image, 2);
            assert!(msg.contains("2 nodes lack image nope:1"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    // Too big for every node.
    let mut r = req();
    r.memory_mb = 40 * 1024;
    assert!(matches!(
        candidates(&v, &r, &none, 1, 2),
        Err(PlaceError::Unschedulable(_, Exclusions { too_big: 2, .. }))
    ));
    // No nodes at all: unavailable, not unschedulable.
    assert!(matches!(
        candidates(&view(vec![]), &req(), &none, 1, 2),
        Err(PlaceError::Unavailable(..))
    ));
    // Lost nodes are not candidates; short of memory and full ones neither.
    let mut v = view(vec![node("a"), node("b"), node("c"), node("d")]);
    v.members
        .get_mut(&"a".parse::<NodeId>().unwrap())
        .unwrap()
        .lost = true;
    v.members
        .get_mut(&"b".parse::<NodeId>().unwrap())
        .unwrap()
        .record
        .load
        .memory_available_mb = 100;
    v.members
        .get_mut(&"c".parse::<NodeId>().unwrap())
        .unwrap()
        .record
        .load
        .running = 10_000;
    let order = candidates(&v, &req(), &none, 1, 2).unwrap();
    assert_eq!(order, vec!["d".parse::<NodeId>().unwrap()]);
}

#[test]
fn digests_need_the_layer_or_a_blob_store() {
    let mut a = node("a");
    a.blob_store = true;
    let v = view(vec![a, node("b")]);
    let mut r = req();
    r.image = vec!["default".into(), "sha256:remote".into()];
    let order = candidates(&v, &r, &none, 7, 2).unwrap();
    assert_eq!(order, vec!["a".parse::<NodeId>().unwrap()]);
    r.image = vec!["sha256:base".into()];
    assert_eq!(candidates(&v, &r, &none, 7, 2).unwrap().len(), 2);
}

#[test]
fn a_key_asks_its_home_alone_whatever_the_load() {
    let mut nodes: Vec<NodeRecord> = (0..8).map(|i| node(&format!("n{i}"))).collect();
    // n3 is full as this gateway sees it, n5 short of memory: neither moves a key.
    nodes[3].capacity.max_sandboxes = 10;
    nodes[3].load.running = 10;
    nodes[5].capacity.min_free_memory_mb = 1024;
    nodes[5].load.memory_available_mb = 10;
    let v = view(nodes);
    let mut r = req();
    let mut homes = HashMap::new();
    for i in 0..400 {
        r.key = Some(format!("key-{i}"));
        let a = candidates(&v, &r, &none, 1, 2).unwrap();
        // Another gateway with other placements in flight and another seed.
        let busy = |id: &NodeId| if id.as_str() == "n1" { 5000 } else { 0 };
        let b = candidates(&v, &r, &busy, 99, 2).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 1, "a key is never retried on another node: {a:?}");
        *homes.entry(a[0].clone()).or_insert(0) += 1;
    }
    // The keys spread over every node, busy ones included.
    assert_eq!(homes.len(), 8, "{homes:?}");
}

#[test]
fn a_key_moves_only_when_its_home_drains_or_leaves() {
    let nodes: Vec<NodeRecord> = (0..4).map(|i| node(&format!("n{i}"))).collect();
    let mut v = view(nodes);
    let mut r = req();
    r.key = Some("episode-7".into());
    let home = candidates(&v, &r, &none, 1, 2).unwrap()[0].clone();
    v.drained.insert(home.clone());
    let moved = candidates(&v, &r, &none, 1, 2).unwrap()[0].clone();
    assert_ne!(moved, home);
    v.drained.clear();
    v.members.get_mut(&home).unwrap().lost = true;
    assert_eq!(candidates(&v, &r, &none, 1, 2).unwrap()[0], moved);
    // Every home gone: the error a keyless request gets.
    for m in v.members.values_mut() {
        m.lost = true;
    }
    assert!(candidates(&v, &r, &none, 1, 2).is_err());
}

#[test]
fn prefers_less_loaded_nodes_and_counts_placements_in_flight() {
    let mut a = node("a");
    a.load.running = 500;
    let v = view(vec![a, node("b")]);
    // With two nodes and k = 2, both are sampled: the lighter one comes first.
    let order = candidates(&v, &req(), &none, 3, 2).unwrap();
    assert_eq!(order[0].as_str(), "b");
    let flight = |id: &NodeId| if id.as_str() == "b" { 600 } else { 0 };
    let order = candidates(&v, &req(), &flight, 3, 2).unwrap();
    assert_eq!(order[0].as_str(), "a");
    assert_eq!(order.len(), 2, "the others follow for retries");
}

#[test]
fn prefers_layers_and_warm_pools_at_equal_load() {
    let mut a = node("a");
    a.layers.clear();
    let v = view(vec![a, node("b")]);
    assert_eq!(
        candidates(&v, &req(), &none, 5, 2).unwrap()[0].as_str(),
        "b"
    );
    let mut a = node("a");
    a.pools.push(WarmPool {
        image: vec!["default".into()],
        memory_mb: 512,
        idle: 2,
        busy: 0,
    });
    let v = view(vec![a, node("b")]);
    let mut r = req();
    r.call = true;
    assert_eq!(candidates(&v, &r, &none, 5, 2).unwrap()[0].as_str(), "a");
}

/// Power of two choices with in-flight counting: 38,000 placements over 12 equal nodes whose
/// published load lags by 100 placements stay within 10% of the mean.
#[test]
fn spreads_evenly_with_a_lagging_view() {
    let n = 12;
    let mut v = view((0..n).map(|i| node(&format!("n{i}"))).collect());
    let ids: Vec<NodeId> = v.members.keys().cloned().collect();
    let mut placed: HashMap<NodeId, u64> = HashMap::new();
    let mut unpublished: HashMap<NodeId, u64> = HashMap::new();
    for i in 0..38_000u64 {
        let snapshot = unpublished.clone();
        let flight = move |id: &NodeId| snapshot.get(id).copied().unwrap_or(0);
        let order = candidates(&v, &req(), &flight, i * 7919 + 1, 2).unwrap();
        *placed.entry(order[0].clone()).or_default() += 1;
        *unpublished.entry(order[0].clone()).or_default() += 1;
        if i % 100 == 99 {
            for id in &ids {
                let m = v.members.get_mut(id).unwrap();
                m.record.load.running = placed.get(id).copied().unwrap_or(0);
            }
            unpublished.clear();
        }
    }
    let max = *placed.values().max().unwrap() as f64;
    let mean = 38_000.0 / n as f64;
    assert!(max / mean <= 1.10, "max/mean {} ({placed:?})", max / mean);
}

#[test]
fn reasons_agree_with_their_counts() {
    let ex = Exclusions {
        draining: 1,
        image: 1,
        full: 2,
        ..Default::default()
    };
    assert_eq!(
        ex.describe(&req()),
        "1 node lacks image default, 1 node is draining, 2 nodes are full"
    );
}
