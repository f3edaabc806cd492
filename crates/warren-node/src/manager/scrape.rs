//! The sandboxes' part of `/metrics`, read when scraped: what the manager recorded
//! ([`crate::metrics::Metrics`]), the sandboxes by state and substrate, the CPU they asked
//! for and used, and the state file's size.
//!
//! A scrape walks the sandbox map once under its read lock, taking each sandbox's own lock
//! only to read two fields, and reads one cgroup file for the CPU of all sandboxes together:
//! its cost grows with the number of sandboxes by a few hundred nanoseconds each, and nothing
//! inside a sandbox is asked.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use warren_types::SandboxState;

use super::stats::{share, window_start};
use super::{now_ms, Manager, Telemetry};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
    substrate: &'static str,
}

const STATES: [SandboxState; 5] = [
    SandboxState::Creating,
    SandboxState::Running,
    SandboxState::Paused,
    SandboxState::Stopped,
    SandboxState::Failed,
];

impl Telemetry {
    /// Adds the sandboxes' figures to a scrape's registry: the counters, and what `sandboxes`
    /// holds now.
    pub fn register_metrics(&self, reg: &mut Registry, sandboxes: &Manager) {
        self.metrics().register(reg);
        let by_state: Family<StateLabels, Gauge> = Family::default();
        // Every state of every served substrate is listed, zero or not, so a series does not
        // vanish when its last sandbox goes.
        for substrate in sandboxes.substrates().served() {
            for state in STATES {
                let _ = by_state.get_or_create(&StateLabels {
                    state: state.as_str(),
                    substrate: substrate.as_str(),
                });
            }
        }
        let mut requested_cpus = 0.0;
        for sb in sandboxes.inner.registry.map().values() {
            let st = sb.lock();
            by_state
                .get_or_create(&StateLabels {
                    state: st.info.state.as_str(),
                    substrate: st.info.substrate.as_str(),
                })
                .inc();
            if st.info.state == SandboxState::Running {
                requested_cpus += st.info.limits.cpus;
            }
        }
        reg.register(
            "warren_sandboxes",
            "Sandboxes on this node by state and substrate",
            by_state,
        );
        let requested: Gauge<f64, AtomicU64> = Gauge::default();
        requested.set(requested_cpus);
        reg.register(
            "warren_sandboxes_cpus_requested",
            "CPUs asked for by the running sandboxes' limits",
            requested,
        );
        if let Some(cpu_us) = sandboxes
            .substrates()
            .runtimes()
            .iter()
            .find_map(|r| r.node_usage())
            .and_then(|u| u.cpu_usec)
        {
            reg.register(
                "warren_sandboxes_cpu_seconds",
                "CPU time used by every sandbox of the node together (its parent cgroups)",
                ConstCounter::new(cpu_us as f64 / 1e6),
            );
            if let Some(idle) = self.idle_share(cpu_us, requested_cpus) {
                let g: Gauge<f64, AtomicU64> = Gauge::default();
                g.set(idle);
                reg.register(
                    "warren_sandboxes_cpu_idle_ratio",
                    "Share of the running sandboxes' requested CPU left unused since the previous scrape (1 - used / requested)",
                    g,
                );
            }
        }
        let (bytes, max) = self.state_usage(sandboxes);
        reg.register(
            "warren_state_bytes",
            "Size of the node's state (state file and trajectory logs)",
            ConstGauge::new(bytes as i64),
        );
        reg.register(
            "warren_state_max_bytes",
            "State size beyond which no output is kept",
            ConstGauge::new(max as i64),
        );
    }

    /// `1 - used / requested` over the window since the previous scrape (at least
    /// [`super::stats::MIN_WINDOW_MS`] long: a quicker scrape reuses that start), clamped to `[0, 1]`; `None`
    /// on the first scrape and while nothing runs.
    fn idle_share(&self, cpu_us: u64, requested_cpus: f64) -> Option<f64> {
        let now = now_ms();
        let mut last = self.scraped_cpu();
        let from = window_start(&mut last, now, cpu_us)?;
        if requested_cpus <= 0.0 {
            return None;
        }
        let (used, _) = share(from, (now, cpu_us), requested_cpus)?;
        Some((1.0 - used).clamp(0.0, 1.0))
    }
}
