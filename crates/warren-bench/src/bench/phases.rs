//! Where the time of an `exec true` round trip goes, from the node's own histograms.
//!
//! The node times every HTTP request to its response head, every command from the agent's
//! start to its exit (`warren_exec_duration_seconds`) and every wait for a trajectory commit
//! (`warren_trajectory_append_seconds`). Their sums and counts scraped right before and right
//! after the benchmark give the mean of each over exactly its calls; next to the client's mean
//! round trip they split it into phases. Means, not medians: a histogram's buckets are too
//! coarse for a p50 of a millisecond.

use serde::Serialize;

/// The exec route's label set in `warren_http_request_seconds`.
const EXEC_ROUTE: &[&str] = &["method=\"POST\"", "route=\"/v1/sandboxes/{id}/exec\""];

/// Mean time per call of each phase, in ms.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Phases {
    /// Calls the node counted between the two scrapes.
    pub calls: u64,
    /// The client's mean round trip.
    pub round_trip_ms: f64,
    /// Outside the node's handler: the client library, the socket, HTTP framing.
    pub client_and_transport_ms: f64,
    /// In the handler but neither in the agent nor waiting for the log: routing, parsing and
    /// validation, the step check, building the agent's request and the JSON answer.
    pub handler_ms: f64,
    /// The agent: request frame, fork and exec of the command, the command itself, its exit
    /// and output frames.
    pub agent_ms: f64,
    /// Waiting for the trajectory entry to be on disk.
    pub commit_wait_ms: f64,
}

/// Sum and count of the histogram `name` over the series whose labels hold every one of
/// `labels` (all series when `labels` is empty).
fn sum_count(text: &str, name: &str, labels: &[&str]) -> (f64, f64) {
    let pick = |suffix: &str| -> f64 {
        let prefix = format!("{name}_{suffix}");
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(&prefix)?;
                let (series, value) = match rest.strip_prefix('{') {
                    Some(r) => {
                        let (series, value) = r.rsplit_once('}')?;
                        (series, value)
                    }
                    None => ("", rest),
                };
                if !value.starts_with(' ') || !labels.iter().all(|want| series.contains(want)) {
                    return None;
                }
                value.trim().parse::<f64>().ok()
            })
            .sum()
    };
    (pick("sum"), pick("count"))
}

/// Mean in ms of what `name` gained between two scrapes, and the calls it gained.
fn mean_between(before: &str, after: &str, name: &str, labels: &[&str]) -> Option<(f64, f64)> {
    let (s0, c0) = sum_count(before, name, labels);
    let (s1, c1) = sum_count(after, name, labels);
    let calls = c1 - c0;
    (calls > 0.0).then(|| ((s1 - s0) / calls * 1000.0, calls))
}

impl Phases {
    /// The phases of the calls made between the scrapes `before` and `after`, given the
    /// client's mean round trip over them; `None` when the node did not count them (an older
    /// node, or metrics turned off).
    pub fn between(before: &str, after: &str, round_trip_ms: f64) -> Option<Phases> {
        let (http, calls) = mean_between(before, after, "warren_http_request_seconds", EXEC_ROUTE)?;
        let (agent, _) = mean_between(
            before,
            after,
            "warren_exec_duration_seconds",
            &["substrate=\"container\""],
        )?;
        let (commit, _) = mean_between(before, after, "warren_trajectory_append_seconds", &[])?;
        Some(Phases {
            calls: calls as u64,
            round_trip_ms,
            client_and_transport_ms: (round_trip_ms - http).max(0.0),
            handler_ms: (http - agent - commit).max(0.0),
            agent_ms: agent,
            commit_wait_ms: commit,
        })
    }

    /// The text report: one line per phase with its share of the round trip.
    pub fn render(&self) -> String {
        let share = |ms: f64| {
            if self.round_trip_ms > 0.0 {
                ms / self.round_trip_ms * 100.0
            } else {
                0.0
            }
        };
        let rows = [
            (
                "client, socket and HTTP framing",
                self.client_and_transport_ms,
            ),
            ("handler: parse, step check, answer", self.handler_ms),
            ("agent: fork, exec, command, exit", self.agent_ms),
            ("trajectory commit wait", self.commit_wait_ms),
        ];
        let mut out = format!(
            "EXEC PHASE (means over {} calls)     MS     SHARE\n",
            self.calls
        );
        for (name, ms) in rows {
            out.push_str(&format!("{name:<36} {ms:>6.3}  {:>4.0} %\n", share(ms)));
        }
        out.push_str(&format!(
            "{:<36} {:>6.3}  100 %\n",
            "round trip (client mean)", self.round_trip_ms
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
warren_http_request_seconds_sum{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\"} 1.0
warren_http_request_seconds_count{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\"} 100
warren_http_request_seconds_sum{method=\"POST\",route=\"/v1/sandboxes/{id}/exec/attach\"} 9.0
warren_http_request_seconds_count{method=\"POST\",route=\"/v1/sandboxes/{id}/exec/attach\"} 9
warren_exec_duration_seconds_sum{substrate=\"container\"} 0.5
warren_exec_duration_seconds_count{substrate=\"container\"} 100
warren_trajectory_append_seconds_sum 0.2
warren_trajectory_append_seconds_count 100
";

    const AFTER: &str = "\
warren_http_request_seconds_sum{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\"} 3.0
warren_http_request_seconds_count{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\"} 1100
warren_http_request_seconds_sum{method=\"POST\",route=\"/v1/sandboxes/{id}/exec/attach\"} 99.0
warren_http_request_seconds_count{method=\"POST\",route=\"/v1/sandboxes/{id}/exec/attach\"} 10
warren_exec_duration_seconds_sum{substrate=\"container\"} 1.5
warren_exec_duration_seconds_count{substrate=\"container\"} 1100
warren_trajectory_append_seconds_sum 0.7
warren_trajectory_append_seconds_count 1100
";

    #[test]
    fn the_phases_split_the_round_trip_by_the_nodes_own_means() {
        let p = Phases::between(BEFORE, AFTER, 2.5).unwrap();
        assert_eq!(p.calls, 1000);
        // 2 s over 1,000 calls in the handler, of which 1 ms in the agent, 0.5 ms committing.
        assert!((p.agent_ms - 1.0).abs() < 1e-9, "{p:?}");
        assert!((p.commit_wait_ms - 0.5).abs() < 1e-9, "{p:?}");
        assert!((p.handler_ms - 0.5).abs() < 1e-9, "{p:?}");
        assert!((p.client_and_transport_ms - 0.5).abs() < 1e-9, "{p:?}");
        let text = p.render();
        assert!(text.contains("trajectory commit wait"), "{text}");
    }

    #[test]
    fn a_node_that_counted_nothing_has_no_phases() {
        assert_eq!(Phases::between(BEFORE, BEFORE, 1.0), None);
        assert_eq!(Phases::between("", "", 1.0), None);
    }
}
