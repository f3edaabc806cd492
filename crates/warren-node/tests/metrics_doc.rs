//! Every metric `docs/metrics.md` lists exists in the code: its name (without the `_total`
//! or `_info` the encoder adds) is registered as a string literal in some crate's sources.
//! The other direction (every family a scrape shows is listed) is checked by the node's and
//! the gateway's own metrics tests.

use std::path::Path;

fn sources(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
}

#[test]
fn every_documented_metric_is_registered_somewhere() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    let mut code = String::new();
    for krate in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        let src = krate.path().join("src");
        if src.is_dir() {
            sources(&src, &mut code);
        }
    }
    let mut listed = 0;
    let mut missing = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `")) {
        let name = line[3..].split('`').next().unwrap();
        listed += 1;
        let base = name
            .strip_suffix("_total")
            .or_else(|| name.strip_suffix("_info"))
            .unwrap_or(name);
        if !code.contains(&format!("\"{base}\"")) {
            missing.push(name.to_string());
        }
    }
    assert!(
        listed > 40,
        "only {listed} metrics found in docs/metrics.md"
    );
    assert!(
        missing.is_empty(),
        "listed but not in the code: {missing:?}"
    );
}
