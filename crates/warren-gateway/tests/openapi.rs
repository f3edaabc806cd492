//! The gateway serves every route of `api/openapi.yaml` (the node's and its own), no more.

use std::collections::BTreeSet;

#[test]
fn gateway_routes_match_the_whole_spec() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let spec: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut in_spec = BTreeSet::new();
    for (p, item) in spec["paths"].as_mapping().unwrap() {
        for (m, _) in item.as_mapping().unwrap() {
            let m = m.as_str().unwrap();
            if ["get", "put", "post", "delete", "patch", "head", "options"].contains(&m) {
                in_spec.insert((m.to_uppercase(), p.as_str().unwrap().to_string()));
            }
        }
    }
    // The gateway serves the dashboard beside the API.
    let in_code: BTreeSet<(String, String)> = warren_gateway::routes()
        .chain(warren_ui::ROUTES.iter().copied())
        .map(|(m, p)| (m.to_string(), warren_types::routes::openapi_path(p)))
        .collect();
    assert_eq!(
        in_code.difference(&in_spec).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "gateway routes missing from api/openapi.yaml"
    );
    assert_eq!(
        in_spec.difference(&in_code).collect::<Vec<_>>(),
        Vec::<&(String, String)>::new(),
        "routes of api/openapi.yaml the gateway does not serve"
    );
}

fn properties(spec: &serde_yaml::Value, name: &str) -> BTreeSet<String> {
    spec["components"]["schemas"][name]["properties"]
        .as_mapping()
        .unwrap_or_else(|| panic!("schema {name} has properties"))
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect()
}

fn fields_of<T: serde::Serialize>(value: &T) -> BTreeSet<String> {
    serde_json::to_value(value)
        .unwrap()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

#[test]
fn cluster_schemas_name_the_serialized_fields() {
    use warren_types::*;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    let spec: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rec = NodeRecord {
        format: NODE_RECORD_FORMAT,
        id: "n1".parse().unwrap(),
        incarnation: "i".into(),
        address: "http://x".into(),
        version: "0".into(),
        started_at_ms: 0,
        substrates: vec![],
        capacity: NodeCapacity::default(),
        load: NodeLoad::default(),
        pools: vec![],
        images: Default::default(),
        layers: vec![],
        blob_store: false,
    };
    let summary = NodeSummary {
        id: rec.id.clone(),
        state: NodeState::Ready,
        record: (&rec).into(),
        in_flight: 0,
    };
    let info = ClusterInfo {
        nodes: vec![],
        etcd_connected: true,
        revision: 1,
    };
    for (name, fields) in [
        ("NodeSummary", fields_of(&summary)),
        ("NodeCapacity", fields_of(&NodeCapacity::default())),
        (
            "NodeLoad",
            fields_of(&NodeLoad {
                by_substrate: [("container".to_string(), 1)].into(),
                ..Default::default()
            }),
        ),
        ("WarmPool", fields_of(&WarmPool::default())),
        ("ClusterInfo", fields_of(&info)),
    ] {
        assert_eq!(properties(&spec, name), fields, "schema {name}");
    }
}
