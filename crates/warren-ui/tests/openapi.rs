//! `api/openapi.yaml` lists the dashboard's routes (marked `x-warren-ui`), no more, no less.

use std::collections::BTreeSet;

#[test]
fn dashboard_routes_match_the_spec() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let spec: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut in_spec = BTreeSet::new();
    for (p, item) in spec["paths"].as_mapping().unwrap() {
        if item["x-warren-ui"].as_bool() != Some(true) {
            continue;
        }
        for (m, _) in item.as_mapping().unwrap() {
            let m = m.as_str().unwrap();
            if ["get", "put", "post", "delete", "patch"].contains(&m) {
                in_spec.insert((m.to_uppercase(), p.as_str().unwrap().to_string()));
            }
        }
    }
    let in_code: BTreeSet<(String, String)> = warren_ui::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(in_spec, in_code);
}
