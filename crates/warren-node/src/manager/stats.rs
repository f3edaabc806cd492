//! `GET /v1/sandboxes/{id}/stats`: a sandbox's resource use now, read from its runtime (the
//! cgroups), never from inside it: a paused sandbox stays paused and a busy one is not asked.

use warren_types::{SandboxId, SandboxStats};

use super::{now_ms, Manager, Telemetry};
use crate::error::NodeError;

/// A stats window shorter than this is too noisy: the previous sample stays the start.
pub(super) const MIN_WINDOW_MS: u64 = 250;

/// CPU share over a window: `(share, window in seconds)`, or `None` for an empty window.
pub(super) fn share(from: (u64, u64), to: (u64, u64), cpus: f64) -> Option<(f64, f64)> {
    let ms = to.0.checked_sub(from.0).filter(|ms| *ms > 0)?;
    let used_us = to.1.saturating_sub(from.1) as f64;
    let cores = cpus.max(0.01);
    Some((used_us / (ms as f64 * 1000.0 * cores), ms as f64 / 1000.0))
}

/// The start of the window ending at `now` (with `cpu` µs used so far) when `last` holds the
/// previous sample: that sample, which `now` replaces once it is [`MIN_WINDOW_MS`] old (a
/// quicker reading keeps the older start). `None` on the first reading, which becomes the
/// sample.
pub(super) fn window_start(
    last: &mut Option<(u64, u64)>,
    now: u64,
    cpu: u64,
) -> Option<(u64, u64)> {
    match *last {
        Some(prev) if now.saturating_sub(prev.0) >= MIN_WINDOW_MS => {
            *last = Some((now, cpu));
            Some(prev)
        }
        Some(prev) => Some(prev),
        None => {
            *last = Some((now, cpu));
            None
        }
    }
}

impl Telemetry {
    /// What sandbox `id` of `sandboxes` uses now, against its limits.
    pub fn stats(&self, sandboxes: &Manager, id: &SandboxId) -> Result<SandboxStats, NodeError> {
        let sb = sandboxes.lookup(id)?;
        let (info, instance) = {
            let st = sb.lock();
            (st.info.clone(), st.instance.clone())
        };
        let usage = instance.map(|i| i.usage()).unwrap_or_default();
        let now = now_ms();
        let limits = &info.limits;
        let (cpu_share, window_secs) = match usage.cpu_usec {
            Some(cpu) => {
                let mut last = sb.cpu_sample.lock().expect("cpu sample lock");
                let since_start = (info.created_at_ms, 0);
                let from = window_start(&mut last, now, cpu).unwrap_or(since_start);
                share(from, (now, cpu), limits.cpus)
                    .or_else(|| share(since_start, (now, cpu), limits.cpus))
                    .unzip()
            }
            None => (None, None),
        };
        let disk_bytes = if info.substrate.layer_in_memory(limits.disk_medium) {
            usage.shmem_bytes
        } else {
            usage.disk_bytes
        };
        Ok(SandboxStats {
            id: info.id.clone(),
            state: info.state,
            sampled_at_ms: now,
            cpu_usec: usage.cpu_usec,
            cpu_share,
            window_secs,
            cpus: limits.cpus,
            memory_bytes: usage.memory_bytes,
            memory_peak_bytes: usage.memory_peak_bytes,
            memory_limit_bytes: limits.memory_mb << 20,
            disk_bytes,
            disk_limit_bytes: limits.disk_mb << 20,
            pids: usage.pids,
            pids_limit: limits.pids,
            oom_kills: usage.oom_kills,
            trajectory_bytes: sb.log.stored_bytes(),
            trajectory_budget_bytes: limits.trajectory_mb << 20,
            idle_secs: now.saturating_sub(info.last_activity_ms) as f64 / 1000.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::share;

    #[test]
    fn cpu_share_is_cpu_time_over_the_window_and_the_limit() {
        // 0.5 s of CPU over 1 s with a limit of 2 cores: a quarter of the limit.
        let (s, w) = share((1_000, 0), (2_000, 500_000), 2.0).unwrap();
        assert!((s - 0.25).abs() < 1e-9 && (w - 1.0).abs() < 1e-9);
        assert_eq!(share((2_000, 0), (2_000, 10), 1.0), None, "empty window");
        assert_eq!(share((3_000, 0), (2_000, 10), 1.0), None, "clock went back");
        // A counter that went back (a restarted cgroup) uses nothing, not a wrap-around.
        assert_eq!(share((0, 900), (1_000, 100), 1.0).unwrap().0, 0.0);
    }
}
