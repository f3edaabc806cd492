//! The sandboxes' telemetry, a part of its own beside the manager: the counters the manager
//! records into ([`Metrics`]), the change feed of `GET /v1/events` (`events`), and what is
//! read when asked: a scrape's figures (`scrape`, with its CPU window) and one sandbox's
//! resource use (`stats`). Reading walks the sandbox registry it is handed; it changes nothing.

use std::sync::{Arc, Mutex};

use super::events::Events;
use super::{Manager, Sandbox};
use crate::metrics::Metrics;
use warren_types::SandboxState;

/// Owns the sandboxes' metrics, the event feed and the scrape's CPU window. Cheap to clone;
/// every clone is the same.
#[derive(Clone, Default)]
pub struct Telemetry {
    state: Arc<State>,
}

#[derive(Default)]
struct State {
    metrics: Metrics,
    /// Sandbox changes for `GET /v1/events`.
    events: Events,
    /// The sandboxes' CPU time read by the last scrape, `(ms since the epoch, µs of CPU)`:
    /// the start of the next scrape's idle-share window.
    scraped_cpu: Mutex<Option<(u64, u64)>>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// The counters the manager records into.
    pub fn metrics(&self) -> &Metrics {
        &self.state.metrics
    }

    pub(crate) fn events(&self) -> &Events {
        &self.state.events
    }

    pub(super) fn scraped_cpu(&self) -> std::sync::MutexGuard<'_, Option<(u64, u64)>> {
        self.state.scraped_cpu.lock().expect("scraped cpu lock")
    }
}

/// The figures a node reports of its sandboxes (health, cluster record, events feed).
impl Telemetry {
    /// The load summary a cluster gateway places by: sandboxes by state, memory reserved by
    /// the limits of starting and running ones, host memory, CPU pressure.
    pub fn load(&self, sandboxes: &Manager) -> warren_types::NodeLoad {
        let all: Vec<Arc<Sandbox>> = sandboxes.inner.registry.map().values().cloned().collect();
        let mem = sandboxes.inner.admission.memory();
        let mut load = warren_types::NodeLoad {
            memory_available_mb: mem.available_mb(),
            cpu_pressure: crate::pressure::cpu_some_avg10().unwrap_or(0.0),
            ..Default::default()
        };
        for sb in all {
            let st = sb.lock();
            *load
                .by_substrate
                .entry(st.info.substrate.as_str().to_string())
                .or_default() += 1;
            match st.info.state {
                SandboxState::Creating => load.creating += 1,
                SandboxState::Running => load.running += 1,
                SandboxState::Paused => load.paused += 1,
                SandboxState::Stopped => load.stopped += 1,
                SandboxState::Failed => load.failed += 1,
            }
            if matches!(
                st.info.state,
                SandboxState::Creating | SandboxState::Running
            ) {
                load.memory_reserved_mb += st.info.limits.memory_mb;
            }
        }
        load
    }

    /// What this node admits at most.
    pub fn capacity(&self, sandboxes: &Manager) -> warren_types::NodeCapacity {
        let cfg = &sandboxes.inner.cfg;
        warren_types::NodeCapacity {
            max_sandboxes: cfg.max_sandboxes as u64,
            max_running: cfg.admission.max_running,
            max_starting: cfg.admission.max_starting,
            memory_total_mb: sandboxes.inner.admission.memory().total_mb(),
            min_free_memory_mb: cfg.admission.min_free_memory_mb,
            max_sandbox_memory_mb: cfg.bounds.max_memory_mb,
        }
    }

    /// The state file's size and its limit, in bytes.
    pub fn state_usage(&self, sandboxes: &Manager) -> (u64, u64) {
        (
            sandboxes.journal().state_bytes(),
            sandboxes.config().state_max_bytes,
        )
    }
}
