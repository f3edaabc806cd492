//! The report page of `bench cluster` (`--report DIR`): the text and JSON, and the scale
//! phase's sandboxes per node as bars.

use super::super::report::{Page, Plot};
use super::ClusterReport;

/// The page of `bench cluster`, with the scale phase's sandboxes per node as bars.
pub fn cluster_page(r: &ClusterReport, text: String) -> anyhow::Result<Page> {
    let mut page = Page::new("warren bench cluster", text, r)?;
    if let Some(s) = r.scale.as_ref().filter(|s| !s.per_node.is_empty()) {
        let mut per_node: Vec<(String, f64)> = s
            .per_node
            .iter()
            .map(|(k, &v)| (k.clone(), v as f64))
            .collect();
        per_node.sort_by(|a, b| natural_key(&a.0).cmp(&natural_key(&b.0)));
        page.plots.push(Plot {
            file: "cluster-balance.svg".into(),
            caption: format!(
                "Sandboxes per node after the scale phase ({} sandboxes over {} nodes; \
                 max/mean {:.3})",
                s.create.created, s.nodes, s.imbalance
            ),
            svg: super::super::report::plots::bars(
                "cluster placement balance",
                "node",
                "sandboxes",
                &per_node,
            )?,
        });
    }
    Ok(page)
}

/// Sorts `s3` before `s12`: the text before the trailing number, then the number.
pub(crate) fn natural_key(s: &str) -> (&str, u64) {
    let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let (head, tail) = s.split_at(s.len() - digits);
    (head, tail.parse().unwrap_or(0))
}
