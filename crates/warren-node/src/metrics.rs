//! Node counters and the Prometheus text exposition of `/metrics`.
//!
//! Plain atomics, written by the manager as things happen; rendering takes a snapshot of the
//! sandbox states from the manager. No locks are held while rendering the counters.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use warren_types::SandboxState;

/// Upper bounds (seconds) of the exec latency histogram buckets.
const EXEC_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0,
];

/// Upper bounds (seconds) of the trajectory append latency buckets: from the queue to the
/// commit (fsync) being done.
const APPEND_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
    1.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug)]
struct Histogram<const N: usize> {
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl<const N: usize> Histogram<N> {
    fn observe(&self, bounds: &[f64; N], d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in bounds.iter().enumerate() {
            if secs <= *le {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, bounds: &[f64; N]) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, le) in bounds.iter().enumerate() {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{le}\"}} {}",
                get(&self.buckets[i])
            );
        }
        let count = get(&self.count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", get(&self.sum_us) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Every counter the node exports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub creates: AtomicU64,
    pub create_errors: AtomicU64,
    pub deletes: AtomicU64,
    pub reaped_ttl: AtomicU64,
    pub reaped_idle: AtomicU64,
    pub lost: AtomicU64,
    pub execs: AtomicU64,
    pub exec_errors: AtomicU64,
    pub pauses: AtomicU64,
    pub paused_idle: AtomicU64,
    pub resumes: AtomicU64,
    pub forks: AtomicU64,
    pub replays: AtomicU64,
    pub step_conflicts: AtomicU64,
    pub trajectory_appends: AtomicU64,
    exec_buckets: [AtomicU64; EXEC_BUCKETS.len()],
    exec_count: AtomicU64,
    exec_sum_us: AtomicU64,
    appends: Histogram<{ APPEND_BUCKETS.len() }>,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn inc_by(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Records one finished exec's wall time.
    pub fn observe_exec(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in EXEC_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.exec_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.exec_count.fetch_add(1, Ordering::Relaxed);
        self.exec_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Records how long one trajectory append waited for its commit.
    pub fn observe_append(&self, d: Duration) {
        self.appends.observe(&APPEND_BUCKETS, d);
    }

    /// The Prometheus text format, with `states` the number of sandboxes per state.
    pub fn render(&self, states: &[(SandboxState, u64)]) -> String {
        let mut out = String::with_capacity(4096);
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP warren_sandboxes Sandboxes on this node by state.\n# TYPE warren_sandboxes gauge\n");
        for (state, n) in states {
            let _ = writeln!(out, "warren_sandboxes{{state=\"{}\"}} {n}", state.as_str());
        }
        let counters: [(&str, &str, &AtomicU64); 15] = [
            (
                "warren_sandbox_creates_total",
                "Sandboxes created.",
                &self.creates,
            ),
            (
                "warren_sandbox_create_errors_total",
                "Sandbox creates that failed.",
                &self.create_errors,
            ),
            (
                "warren_sandbox_deletes_total",
                "Sandboxes deleted by a call.",
                &self.deletes,
            ),
            (
                "warren_sandbox_ttl_expired_total",
                "Sandboxes deleted because their TTL passed.",
                &self.reaped_ttl,
            ),
            (
                "warren_sandbox_idle_reaped_total",
                "Sandboxes deleted because they were idle.",
                &self.reaped_idle,
            ),
            (
                "warren_sandbox_lost_total",
                "Sandboxes whose agent exited on its own.",
                &self.lost,
            ),
            (
                "warren_exec_total",
                "Commands run with exec or exec/stream.",
                &self.execs,
            ),
            (
                "warren_exec_errors_total",
                "Exec calls that failed before the command exited.",
                &self.exec_errors,
            ),
            (
                "warren_sandbox_pauses_total",
                "Sandboxes paused (by a call or the idle timeout).",
                &self.pauses,
            ),
            (
                "warren_sandbox_idle_paused_total",
                "Sandboxes paused because they were idle.",
                &self.paused_idle,
            ),
            (
                "warren_sandbox_resumes_total",
                "Sandboxes resumed (by a call, or by a call reaching a paused sandbox).",
                &self.resumes,
            ),
            (
                "warren_sandbox_forks_total",
                "Sandboxes made by fork.",
                &self.forks,
            ),
            (
                "warren_trajectory_replays_total",
                "Calls answered from the trajectory log without running.",
                &self.replays,
            ),
            (
                "warren_trajectory_step_conflicts_total",
                "Calls refused because their step was logged with a different request.",
                &self.step_conflicts,
            ),
            (
                "warren_trajectory_appends_total",
                "Trajectory entries written.",
                &self.trajectory_appends,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(c)
            );
        }
        out.push_str("# HELP warren_exec_duration_seconds Wall time of exec calls.\n# TYPE warren_exec_duration_seconds histogram\n");
        for (i, le) in EXEC_BUCKETS.iter().enumerate() {
            let _ = writeln!(
                out,
                "warren_exec_duration_seconds_bucket{{le=\"{le}\"}} {}",
                get(&self.exec_buckets[i])
            );
        }
        let count = get(&self.exec_count);
        let _ = writeln!(
            out,
            "warren_exec_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "warren_exec_duration_seconds_sum {}",
            get(&self.exec_sum_us) as f64 / 1e6
        );
        let _ = writeln!(out, "warren_exec_duration_seconds_count {count}");
        self.appends.render(
            &mut out,
            "warren_trajectory_append_seconds",
            "Wait of a call for its trajectory entry to be committed (fsync included).",
            &APPEND_BUCKETS,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        m.observe_exec(Duration::from_millis(3));
        m.observe_exec(Duration::from_secs(2));
        Metrics::inc(&m.creates);
        m.observe_append(Duration::from_micros(250));
        let text = m.render(&[(SandboxState::Running, 2)]);
        assert!(text.contains("warren_trajectory_append_seconds_bucket{le=\"0.0002\"} 0\n"));
        assert!(text.contains("warren_trajectory_append_seconds_bucket{le=\"0.0003\"} 1\n"));
        assert!(text.contains("warren_trajectory_append_seconds_count 1\n"));
        assert!(text.contains("warren_sandboxes{state=\"running\"} 2\n"));
        assert!(text.contains("warren_sandbox_creates_total 1\n"));
        assert!(text.contains("warren_exec_duration_seconds_bucket{le=\"0.001\"} 0\n"));
        assert!(text.contains("warren_exec_duration_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("warren_exec_duration_seconds_bucket{le=\"2.5\"} 2\n"));
        assert!(text.contains("warren_exec_duration_seconds_bucket{le=\"+Inf\"} 2\n"));
        assert!(text.contains("warren_exec_duration_seconds_count 2\n"));
    }
}
