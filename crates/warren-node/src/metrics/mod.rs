//! The node's metrics and the `/metrics` exposition (prometheus-client, Prometheus text 0.0.4).
//!
//! [`Metrics`] holds what the manager records as things happen: counters and latency
//! histograms, lock-free to update. Everything else is read when scraped: each owner of state
//! registers its own figures into the scrape's [`Registry`] (the manager its sandboxes, the
//! pools theirs, the image store its layer cache, [`host`] the node's pressure and the daemon's
//! memory), and the registry is encoded once. `docs/metrics.md` lists every metric; a test
//! holds that list to what a scrape shows.

pub mod host;
pub mod shipping;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;
use std::time::Duration;
use warren_types::Substrate;

/// The content type of what [`encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of the exec latency histogram buckets.
const EXEC_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0,
];

/// Upper bounds (seconds) of the trajectory append latency buckets: from the queue to the
/// commit (fsync) being done. Fine around one sync of a quiet disk (0.2–0.6 ms), where the
/// benchmarks' targets are (`warren bench ship` reads the p50 as a bucket's bound).
const APPEND_BUCKETS: [f64; 18] = [
    0.00005, 0.0001, 0.00015, 0.0002, 0.00025, 0.0003, 0.0004, 0.0005, 0.0006, 0.00075, 0.001,
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// Upper bounds (seconds) of creates, their phases, pauses, resumes and forks.
const LIFECYCLE_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0,
];

/// Labels of figures kept per substrate.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BySubstrate {
    pub substrate: &'static str,
}

/// Labels of one phase of a create.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ByPhase {
    pub substrate: &'static str,
    pub phase: &'static str,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn exec_histogram() -> Histogram {
    Histogram::new(EXEC_BUCKETS)
}

fn lifecycle_histogram() -> Histogram {
    Histogram::new(LIFECYCLE_BUCKETS)
}

/// A timed lifecycle change of a sandbox.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Pause,
    Resume,
    Fork,
}

/// What the manager records as things happen. Cheap to update from any thread.
#[derive(Debug)]
pub struct Metrics {
    pub creates: Counter,
    pub create_errors: Counter,
    pub deletes: Counter,
    pub reaped_ttl: Counter,
    pub reaped_idle: Counter,
    pub lost: Counter,
    pub execs: Counter,
    pub exec_errors: Counter,
    pub pauses: Counter,
    pub paused_idle: Counter,
    pub resumes: Counter,
    pub forks: Counter,
    pub replays: Counter,
    pub step_conflicts: Counter,
    pub trajectory_appends: Counter,
    pub network_changes: Counter,
    create_seconds: Histograms<BySubstrate>,
    create_phase_seconds: Histograms<ByPhase>,
    exec_seconds: Histograms<BySubstrate>,
    pause_seconds: Histograms<BySubstrate>,
    resume_seconds: Histograms<BySubstrate>,
    fork_seconds: Histograms<BySubstrate>,
    append_seconds: Histogram,
    /// The trajectory shipper's figures.
    pub shipping: shipping::ShipMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let lifecycle = || Family::new_with_constructor(lifecycle_histogram as fn() -> Histogram);
        Metrics {
            creates: Counter::default(),
            create_errors: Counter::default(),
            deletes: Counter::default(),
            reaped_ttl: Counter::default(),
            reaped_idle: Counter::default(),
            lost: Counter::default(),
            execs: Counter::default(),
            exec_errors: Counter::default(),
            pauses: Counter::default(),
            paused_idle: Counter::default(),
            resumes: Counter::default(),
            forks: Counter::default(),
            replays: Counter::default(),
            step_conflicts: Counter::default(),
            trajectory_appends: Counter::default(),
            network_changes: Counter::default(),
            create_seconds: lifecycle(),
            create_phase_seconds: Family::new_with_constructor(lifecycle_histogram),
            exec_seconds: Family::new_with_constructor(exec_histogram),
            pause_seconds: lifecycle(),
            resume_seconds: lifecycle(),
            fork_seconds: lifecycle(),
            append_seconds: Histogram::new(APPEND_BUCKETS),
            shipping: Default::default(),
        }
    }
}

impl Metrics {
    pub fn inc(counter: &Counter) {
        counter.inc();
    }

    pub fn inc_by(counter: &Counter, n: u64) {
        counter.inc_by(n);
    }

    /// Records one finished exec's wall time.
    pub fn observe_exec(&self, substrate: Substrate, d: Duration) {
        self.exec_seconds
            .get_or_create(&by(substrate))
            .observe(d.as_secs_f64());
    }

    /// Records a finished create: its whole time and each measured phase's.
    pub fn observe_create(
        &self,
        substrate: Substrate,
        total: Duration,
        phases: &[(&'static str, Duration)],
    ) {
        self.create_seconds
            .get_or_create(&by(substrate))
            .observe(total.as_secs_f64());
        for (phase, d) in phases {
            self.create_phase_seconds
                .get_or_create(&ByPhase {
                    substrate: substrate.as_str(),
                    phase,
                })
                .observe(d.as_secs_f64());
        }
    }

    /// Records how long a pause, resume or fork took.
    pub fn observe_change(&self, change: Change, substrate: Substrate, d: Duration) {
        let family = match change {
            Change::Pause => &self.pause_seconds,
            Change::Resume => &self.resume_seconds,
            Change::Fork => &self.fork_seconds,
        };
        family
            .get_or_create(&by(substrate))
            .observe(d.as_secs_f64());
    }

    /// Records how long one trajectory append waited for its commit.
    pub fn observe_append(&self, d: Duration) {
        self.append_seconds.observe(d.as_secs_f64());
    }

    /// Adds every figure of this struct to `reg` (clones share the values).
    pub fn register(&self, reg: &mut Registry) {
        let counters: [(&str, &str, &Counter); 16] = [
            ("warren_sandbox_creates", "Sandboxes created", &self.creates),
            (
                "warren_sandbox_create_errors",
                "Sandbox creates that failed",
                &self.create_errors,
            ),
            (
                "warren_sandbox_deletes",
                "Sandboxes deleted by a call",
                &self.deletes,
            ),
            (
                "warren_sandbox_ttl_expired",
                "Sandboxes deleted because their TTL passed",
                &self.reaped_ttl,
            ),
            (
                "warren_sandbox_idle_reaped",
                "Sandboxes deleted because they were idle",
                &self.reaped_idle,
            ),
            (
                "warren_sandbox_lost",
                "Sandboxes whose agent exited on its own",
                &self.lost,
            ),
            (
                "warren_exec",
                "Commands run with exec, exec/stream or exec/attach",
                &self.execs,
            ),
            (
                "warren_exec_errors",
                "Exec calls that failed before the command exited",
                &self.exec_errors,
            ),
            (
                "warren_sandbox_pauses",
                "Sandboxes paused (by a call or the idle timeout)",
                &self.pauses,
            ),
            (
                "warren_sandbox_idle_paused",
                "Sandboxes paused because they were idle",
                &self.paused_idle,
            ),
            (
                "warren_sandbox_resumes",
                "Sandboxes resumed (by a call, or by a call reaching a paused sandbox)",
                &self.resumes,
            ),
            (
                "warren_sandbox_forks",
                "Sandboxes made by fork",
                &self.forks,
            ),
            (
                "warren_trajectory_replays",
                "Calls answered from the trajectory log without running",
                &self.replays,
            ),
            (
                "warren_trajectory_step_conflicts",
                "Calls refused because their step was logged with a different request",
                &self.step_conflicts,
            ),
            (
                "warren_trajectory_appends",
                "Trajectory entries written",
                &self.trajectory_appends,
            ),
            (
                "warren_network_policy_changes",
                "Network policies set on running sandboxes (PUT .../network)",
                &self.network_changes,
            ),
        ];
        for (name, help, c) in counters {
            reg.register(name, help, c.clone());
        }
        reg.register(
            "warren_sandbox_create_seconds",
            "Wall time of successful creates, by substrate",
            self.create_seconds.clone(),
        );
        reg.register(
            "warren_sandbox_create_phase_seconds",
            "Wall time of each phase of successful creates (record, image, cgroups, agent, network), by substrate",
            self.create_phase_seconds.clone(),
        );
        reg.register(
            "warren_exec_duration_seconds",
            "Wall time of foreground exec calls, by substrate",
            self.exec_seconds.clone(),
        );
        reg.register(
            "warren_sandbox_pause_seconds",
            "Wall time of pauses, by substrate",
            self.pause_seconds.clone(),
        );
        reg.register(
            "warren_sandbox_resume_seconds",
            "Wall time of resumes, by substrate",
            self.resume_seconds.clone(),
        );
        reg.register(
            "warren_sandbox_fork_seconds",
            "Wall time of forks (all children of one call), by the parent's substrate",
            self.fork_seconds.clone(),
        );
        reg.register(
            "warren_trajectory_append_seconds",
            "Wait of a call for its trajectory entry to be committed (fsync included)",
            self.append_seconds.clone(),
        );
        self.shipping.register(reg);
    }
}

fn by(substrate: Substrate) -> BySubstrate {
    BySubstrate {
        substrate: substrate.as_str(),
    }
}

pub use warren_edge::http_metrics::register_build_info;

/// The Prometheus text of a registry.
pub fn encode(reg: &Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    // Writing into a String cannot fail; an encoder error would be a bug in a metric.
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, reg) {
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_labelled() {
        let m = Metrics::default();
        m.observe_exec(Substrate::Container, Duration::from_millis(3));
        m.observe_exec(Substrate::Container, Duration::from_secs(2));
        Metrics::inc(&m.creates);
        m.observe_append(Duration::from_micros(250));
        m.observe_create(
            Substrate::Function,
            Duration::from_millis(40),
            &[("agent", Duration::from_millis(30))],
        );
        let mut reg = Registry::default();
        m.register(&mut reg);
        register_build_info(&mut reg);
        let text = encode(&reg);
        let has = |line: &str| assert!(text.contains(line), "{line} not in\n{text}");
        has("warren_trajectory_append_seconds_bucket{le=\"0.0002\"} 0\n");
        has("warren_trajectory_append_seconds_bucket{le=\"0.0003\"} 1\n");
        has("warren_trajectory_append_seconds_count 1\n");
        has("warren_sandbox_creates_total 1\n");
        has("warren_exec_duration_seconds_bucket{substrate=\"container\",le=\"0.001\"} 0\n");
        has("warren_exec_duration_seconds_bucket{substrate=\"container\",le=\"0.005\"} 1\n");
        has("warren_exec_duration_seconds_bucket{substrate=\"container\",le=\"2.5\"} 2\n");
        has("warren_exec_duration_seconds_bucket{substrate=\"container\",le=\"+Inf\"} 2\n");
        has("warren_exec_duration_seconds_count{substrate=\"container\"} 2\n");
        has("warren_sandbox_create_seconds_count{substrate=\"function\"} 1\n");
        has(
            "warren_sandbox_create_phase_seconds_count{substrate=\"function\",phase=\"agent\"} 1\n",
        );
        has("warren_build_info{version=\"");
    }
}
