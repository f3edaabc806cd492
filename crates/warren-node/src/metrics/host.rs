//! Figures of the host and the daemon, read when scraped: the host's pressure stall
//! information ([`crate::pressure`]; left out on kernels without PSI) and the daemon's memory
//! and CPU time.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PressureLabels {
    resource: &'static str,
    kind: &'static str,
}

/// Adds the host's pressure and the daemon's memory to `reg`.
pub fn register(reg: &mut Registry) {
    let share: Family<PressureLabels, Gauge<f64, AtomicU64>> = Family::default();
    let stalled: Family<PressureLabels, Gauge<f64, AtomicU64>> = Family::default();
    let mut any = false;
    for resource in ["cpu", "memory", "io"] {
        for p in crate::pressure::read(resource) {
            any = true;
            let labels = PressureLabels {
                resource,
                kind: p.kind,
            };
            share.get_or_create(&labels).set(p.avg10 / 100.0);
            stalled.get_or_create(&labels).set(p.total_us as f64 / 1e6);
        }
    }
    if any {
        reg.register(
            "warren_host_pressure_ratio",
            "Share of the last 10 s some (or all) tasks of the host stalled on a resource (PSI avg10)",
            share,
        );
        reg.register(
            "warren_host_pressure_stalled_seconds",
            "Time tasks of the host stalled on a resource since boot (PSI total), as a gauge",
            stalled,
        );
    }
    if let Some(rss) = resident_bytes() {
        reg.register(
            "process_resident_memory_bytes",
            "Resident memory of the daemon",
            ConstGauge::new(rss as i64),
        );
    }
    if let Some(cpu) = cpu_seconds() {
        reg.register(
            "process_cpu_seconds",
            "CPU time of the daemon (user and system)",
            ConstCounter::new(cpu),
        );
    }
}

/// Adds the node's writable-layer space on disk (where its containers have one) to `reg`.
pub fn register_writable(
    reg: &mut Registry,
    space: Option<warren_runtime::container::WritableSpace>,
) {
    let Some(s) = space else {
        return;
    };
    let gauges: [(&str, &str, u64); 5] = [
        (
            "warren_writable_size_bytes",
            "Size of the node's writable-layer file system",
            s.total_bytes,
        ),
        (
            "warren_writable_used_bytes",
            "Bytes in use on the node's writable-layer file system",
            s.used_bytes,
        ),
        (
            "warren_writable_committed_bytes",
            "Sum of the disk quotas of the node's sandboxes with writable layers on disk",
            s.committed_bytes,
        ),
        (
            "warren_writable_capacity_bytes",
            "What the disk quotas may add up to (size times --disk-overcommit)",
            s.capacity_bytes,
        ),
        (
            "warren_writable_sandboxes",
            "Sandboxes whose writable layer is on disk",
            s.sandboxes,
        ),
    ];
    for (name, help, v) in gauges {
        reg.register(name, help, ConstGauge::new(v as i64));
    }
}

/// The daemon's resident memory (`VmRSS`).
fn resident_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// The daemon's CPU time from `/proc/self/stat` (fields 14 and 15, in clock ticks of 1/100 s,
/// the value of `USER_HZ` on every Linux ABI).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_reads_its_own_figures() {
        assert!(resident_bytes().unwrap() > 0);
        assert!(cpu_seconds().unwrap() >= 0.0);
    }
}
