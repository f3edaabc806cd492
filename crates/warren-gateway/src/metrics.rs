//! The gateway's metrics (prometheus-client), served on its `/metrics`: placements, their
//! retries, requests refused by reason, nodes by state, and requests by route (shared with
//! warrend, [`warren_edge::HttpMetrics`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a request did not get (or keep) the node it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A node answered 429: the placement moved on (or, for a key, the caller waits).
    NodeBusy,
    /// Every candidate refused or could not be reached: 503 `capacity_unavailable`.
    CapacityUnavailable,
    /// No node could ever take it: `unschedulable`.
    Unschedulable,
    /// The node did not answer.
    NodeUnreachable,
    /// The sandbox's node left the cluster.
    SandboxLost,
}

impl Refusal {
    fn as_str(self) -> &'static str {
        match self {
            Refusal::NodeBusy => "node_busy",
            Refusal::CapacityUnavailable => "capacity_unavailable",
            Refusal::Unschedulable => "unschedulable",
            Refusal::NodeUnreachable => "node_unreachable",
            Refusal::SandboxLost => "sandbox_lost",
        }
    }

    const ALL: [Refusal; 5] = [
        Refusal::NodeBusy,
        Refusal::CapacityUnavailable,
        Refusal::Unschedulable,
        Refusal::NodeUnreachable,
        Refusal::SandboxLost,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Debug)]
pub struct Metrics {
    pub requests: Counter,
    pub placed: Counter,
    /// Placements sent on to another candidate after one refused or was unreachable.
    pub retries: Counter,
    refusals: Family<ReasonLabels, Counter>,
    /// Requests by route and status.
    pub http: warren_edge::HttpMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let refusals: Family<ReasonLabels, Counter> = Family::default();
        // Every reason is listed from the start, so rates of a reason that never happened
        // read as zero rather than as missing.
        for r in Refusal::ALL {
            let _ = refusals.get_or_create(&ReasonLabels { reason: r.as_str() });
        }
        Metrics {
            requests: Counter::default(),
            placed: Counter::default(),
            retries: Counter::default(),
            refusals,
            http: warren_edge::HttpMetrics::default(),
        }
    }
}

impl Metrics {
    pub fn inc(c: &Counter) {
        c.inc();
    }

    /// Counts one refusal.
    pub fn refused(&self, why: Refusal) {
        self.refusals
            .get_or_create(&ReasonLabels {
                reason: why.as_str(),
            })
            .inc();
    }

    /// The Prometheus text of every figure, with `nodes` the cluster's nodes by state.
    pub fn render(&self, nodes: &[(&'static str, u64)]) -> String {
        let mut reg = Registry::default();
        warren_edge::http_metrics::register_build_info(&mut reg);
        reg.register(
            "warren_gateway_requests",
            "Requests answered by this gateway",
            self.requests.clone(),
        );
        reg.register(
            "warren_gateway_placements",
            "Creates and calls a node accepted",
            self.placed.clone(),
        );
        reg.register(
            "warren_gateway_placement_retries",
            "Placements sent on to the next candidate after a node refused or was unreachable",
            self.retries.clone(),
        );
        reg.register(
            "warren_gateway_refusals",
            "Requests refused or cut short, by reason (node_busy, capacity_unavailable, unschedulable, node_unreachable, sandbox_lost)",
            self.refusals.clone(),
        );
        let by_state: Family<StateLabels, Gauge> = Family::default();
        for (state, n) in nodes {
            by_state
                .get_or_create(&StateLabels { state })
                .set(*n as i64);
        }
        reg.register(
            "warren_gateway_nodes",
            "Nodes of the cluster by state",
            by_state,
        );
        self.http.register(&mut reg);
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &reg);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_by_reason_and_every_reason_is_listed() {
        let m = Metrics::default();
        m.refused(Refusal::NodeBusy);
        m.refused(Refusal::NodeBusy);
        Metrics::inc(&m.retries);
        let text = m.render(&[("ready", 2), ("lost", 1)]);
        let doc = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/metrics.md"
        ))
        .unwrap();
        m.http.observe("GET", "/v1/health", 200, 0.001);
        let missing = warren_edge::http_metrics::undocumented(&m.render(&[]), &doc);
        assert!(missing.is_empty(), "not in docs/metrics.md: {missing:?}");
        for line in [
            "warren_gateway_refusals_total{reason=\"node_busy\"} 2\n",
            "warren_gateway_refusals_total{reason=\"sandbox_lost\"} 0\n",
            "warren_gateway_placement_retries_total 1\n",
            "warren_gateway_nodes{state=\"ready\"} 2\n",
            "warren_gateway_nodes{state=\"lost\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
