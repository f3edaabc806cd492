//! The gateway's counters, rendered as Prometheus text on `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub placed: AtomicU64,
    pub refusals: AtomicU64,
    pub capacity_unavailable: AtomicU64,
    pub unschedulable: AtomicU64,
    pub node_unreachable: AtomicU64,
    pub sandbox_lost: AtomicU64,
}

impl Metrics {
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self, nodes: &[(&'static str, u64)]) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, v: &AtomicU64| {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        };
        counter(
            "warren_gateway_requests_total",
            "Requests answered by this gateway.",
            &self.requests,
        );
        counter(
            "warren_gateway_placements_total",
            "Creates and calls a node accepted.",
            &self.placed,
        );
        counter(
            "warren_gateway_refusals_total",
            "Node refusals (429) that sent a placement to the next candidate.",
            &self.refusals,
        );
        counter(
            "warren_gateway_capacity_unavailable_total",
            "Placements every candidate refused.",
            &self.capacity_unavailable,
        );
        counter(
            "warren_gateway_unschedulable_total",
            "Placements no node could ever take.",
            &self.unschedulable,
        );
        counter(
            "warren_gateway_node_unreachable_total",
            "Requests whose node did not answer.",
            &self.node_unreachable,
        );
        counter(
            "warren_gateway_sandbox_lost_total",
            "Requests for sandboxes of lost nodes.",
            &self.sandbox_lost,
        );
        out.push_str("# HELP warren_gateway_nodes Nodes of the cluster by state.\n# TYPE warren_gateway_nodes gauge\n");
        for (state, n) in nodes {
            out.push_str(&format!("warren_gateway_nodes{{state=\"{state}\"}} {n}\n"));
        }
        out
    }
}
