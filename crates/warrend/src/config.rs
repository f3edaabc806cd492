//! What `warrend`'s flags make of the node: the container runtime's, the VM runtimes' and the
//! node's configuration. Nothing here touches the host: what the host offers (its memory, its
//! confinement, whether writable layers can live on disk) is handed in, so that every rule
//! from a flag to a setting is unit-tested. The wiring that uses these is `main.rs`.

use anyhow::{bail, Result};
use std::path::Path;
use std::time::Duration;
use warren_node::NodeConfig;
use warren_runtime::container::ContainerConfig;
use warren_runtime::security::SecurityReport;
use warren_runtime::vm::{Accel, VmConfig};
use warren_types::DiskMedium;

use crate::args::Args;

/// The container runtime's configuration; the confinement found on the host is added by the
/// caller (it reads the host).
pub fn container(args: &Args, agent: &Path) -> ContainerConfig {
    let mut c = ContainerConfig::new(args.node.clone(), agent.to_path_buf());
    c.landlock = !args.no_landlock;
    c.agent_spares = args.agent_spares.into();
    c.favor_cgroup_moves = !args.keep_cgroup_options;
    c.id_pool = (args.id_ranges > 0).then_some(warren_runtime::container::ids::IdPoolConfig {
        base: args.id_pool_base,
        slots: args.id_ranges,
    });
    c.writable =
        (args.disk_medium == DiskMedium::Disk).then(|| warren_runtime::container::WritableConfig {
            dir: args.writable_dir.clone().unwrap_or_default(),
            size_mb: args.writable_size_mb,
            overcommit: args.disk_overcommit,
        });
    c.owner_uid_base = (args.sandbox_owner_uid_base != 0).then_some(args.sandbox_owner_uid_base);
    c.user_limits = args.sandbox_user_limit.clone();
    c.memory_overcommit = args.memory_overcommit;
    c
}

/// The microvm and vm runtimes' configuration.
pub fn vm(args: &Args, agent: &Path) -> VmConfig {
    let root = args
        .vm_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("vm"));
    let mut cfg = VmConfig::new(args.node.clone(), agent.to_path_buf(), root);
    cfg.kernel_dir = args.guest_kernel.clone();
    cfg.templates = args.vm_templates;
    cfg.accel = match args.vm_accel.as_str() {
        "kvm" => Some(Accel::Kvm),
        "tcg" => Some(Accel::Tcg),
        _ => None,
    };
    cfg
}

/// What the host offers the node, found by the caller.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The container runtime has a writable-layer file system on disk.
    pub writable_on_disk: bool,
    /// The host's memory, when known.
    pub memory_mb: Option<u64>,
    /// The confinement the node applies.
    pub security: SecurityReport,
}

/// The node's configuration. Refuses flags that contradict each other.
pub fn node(args: &Args, host: Host) -> Result<NodeConfig> {
    let mut cfg = NodeConfig::new(args.node.clone());
    cfg.max_sandboxes = args.max_sandboxes;
    cfg.defaults.trajectory_mb = args.trajectory_mb;
    // Writable layers on disk by default where the node has them; else in memory.
    cfg.defaults.disk_medium = if host.writable_on_disk {
        DiskMedium::Disk
    } else {
        DiskMedium::Memory
    };
    cfg.state_max_bytes = args.state_max_mb << 20;
    if args.default_exec_timeout.is_some_and(|t| t <= 0.0) {
        bail!("--default-exec-timeout must be more than 0");
    }
    cfg.default_ttl_secs = default_ttl(args)?;
    cfg.max_ttl_secs = args.max_ttl;
    cfg.default_exec_timeout_secs = args.default_exec_timeout;
    cfg.admission = warren_node::admission::AdmissionConfig {
        max_starting: args.max_starting,
        max_running: args.max_running,
        min_free_memory_mb: args.min_free_memory_mb,
    };
    cfg.functions.min_warm = args.function_min_warm;
    cfg.functions.max_warm = args.function_max_warm.max(1);
    cfg.functions.max_queue = args.function_queue;
    cfg.functions.queue_timeout = Duration::from_millis(args.function_queue_timeout_ms);
    cfg.functions.max_warm_memory_mb = warm_memory_cap(args.function_max_memory_mb, host.memory_mb);
    cfg.functions.max_cpu_pressure =
        (args.function_max_cpu_pressure < 100.0).then_some(args.function_max_cpu_pressure);
    cfg.security = host.security;
    Ok(cfg)
}

/// The lifetime of a sandbox created without a ttl: `--default-ttl`, the built-in default
/// capped by `--max-ttl`; an operator's default longer than the cap is refused.
fn default_ttl(args: &Args) -> Result<Option<u64>> {
    Ok(match (args.default_ttl.secs, args.max_ttl) {
        (Some(d), Some(m)) if d > m && args.default_ttl.builtin => Some(m),
        (Some(d), Some(m)) if d > m => {
            bail!("--default-ttl ({d} s) is longer than --max-ttl ({m} s)")
        }
        (d, _) => d,
    })
}

/// The warm function containers' memory cap: the operator's, else half the host's memory (at
/// most 64 GiB), and never more than the host has (`host_mb`, when known).
fn warm_memory_cap(asked: Option<u64>, host_mb: Option<u64>) -> u64 {
    const MOST: u64 = 64 * 1024;
    match (asked, host_mb) {
        (Some(a), Some(h)) if a > h => {
            tracing::warn!(
                asked = a,
                host_mb = h,
                "--function-max-memory-mb is more than the host has; using the host's memory"
            );
            h
        }
        (Some(a), _) => a,
        (None, Some(h)) => (h / 2).clamp(1, MOST),
        (None, None) => MOST,
    }
}

/// `86400` as `1d`, `5400` as `90m`: the largest unit that divides it.
pub fn human_secs(s: u64) -> String {
    match s {
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(flags: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("warrend").chain(flags.iter().copied())).unwrap()
    }

    #[test]
    fn warm_memory_never_exceeds_the_host() {
        assert_eq!(warm_memory_cap(None, Some(24_000)), 12_000);
        assert_eq!(warm_memory_cap(None, Some(1 << 20)), 64 * 1024);
        assert_eq!(warm_memory_cap(Some(100_000), Some(24_000)), 24_000);
        assert_eq!(warm_memory_cap(Some(4_096), Some(24_000)), 4_096);
        assert_eq!(warm_memory_cap(None, None), 64 * 1024);
    }

    #[test]
    fn durations_read_in_their_largest_unit() {
        assert_eq!(human_secs(86_400), "1d");
        assert_eq!(human_secs(5_400), "90m");
        assert_eq!(human_secs(61), "61s");
    }

    #[test]
    fn the_default_lifetime_is_a_day_capped_by_the_operators_maximum() {
        let host = Host::default;
        assert_eq!(
            node(&args(&[]), host()).unwrap().default_ttl_secs,
            Some(86_400)
        );
        let capped = node(&args(&["--max-ttl", "1h"]), host()).unwrap();
        assert_eq!(
            (capped.default_ttl_secs, capped.max_ttl_secs),
            (Some(3_600), Some(3_600))
        );
        let none = node(&args(&["--default-ttl", "none"]), host()).unwrap();
        assert_eq!(none.default_ttl_secs, None);
        let e = node(&args(&["--default-ttl", "2h", "--max-ttl", "1h"]), host()).unwrap_err();
        assert!(e.to_string().contains("longer than --max-ttl"), "{e}");
        let e = node(&args(&["--default-exec-timeout", "0"]), host()).unwrap_err();
        assert!(e.to_string().contains("more than 0"), "{e}");
    }

    #[test]
    fn node_settings_follow_the_flags_and_the_host() {
        let a = args(&[
            "--node",
            "n7",
            "--function-max-warm",
            "0",
            "--function-max-cpu-pressure",
            "100",
            "--function-queue-timeout-ms",
            "250",
            "--state-max-mb",
            "3",
        ]);
        let host = Host {
            writable_on_disk: false,
            memory_mb: Some(8_000),
            ..Host::default()
        };
        let c = node(&a, host).unwrap();
        assert_eq!(c.node.as_str(), "n7");
        assert_eq!(c.defaults.disk_medium, DiskMedium::Memory);
        assert_eq!(c.functions.max_warm, 1, "at least one warm container");
        assert_eq!(
            c.functions.max_cpu_pressure, None,
            "100 ignores the pressure"
        );
        assert_eq!(c.functions.queue_timeout, Duration::from_millis(250));
        assert_eq!(c.functions.max_warm_memory_mb, 4_000);
        assert_eq!(c.state_max_bytes, 3 << 20);
        let on_disk = Host {
            writable_on_disk: true,
            ..Host::default()
        };
        assert_eq!(
            node(&args(&[]), on_disk).unwrap().defaults.disk_medium,
            DiskMedium::Disk
        );
    }

    #[test]
    fn container_settings_follow_the_flags() {
        let agent = Path::new("/opt/warren-agent");
        let c = container(&args(&[]), agent);
        assert!(c.landlock && c.favor_cgroup_moves && c.id_pool.is_some() && c.writable.is_some());
        assert_eq!(c.owner_uid_base, Some(1 << 31));
        let c = container(
            &args(&[
                "--no-landlock",
                "--keep-cgroup-options",
                "--id-ranges",
                "0",
                "--disk-medium",
                "memory",
                "--sandbox-owner-uid-base",
                "0",
            ]),
            agent,
        );
        assert!(!c.landlock && !c.favor_cgroup_moves);
        assert!(c.id_pool.is_none(), "0 ranges: the one shared range");
        assert!(
            c.writable.is_none(),
            "memory turns the writable file system off"
        );
        assert_eq!(c.owner_uid_base, None);
        let v = vm(
            &args(&["--state-dir", "/tmp/s", "--vm-accel", "tcg"]),
            agent,
        );
        assert_eq!(v.root, Path::new("/tmp/s/vm"));
        assert!(matches!(v.accel, Some(Accel::Tcg)));
    }
}
