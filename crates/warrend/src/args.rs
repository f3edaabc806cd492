//! `warrend`'s flags, and the parsers of their values. What the flags make of the node is
//! `config.rs`; this file only says what can be asked.

use anyhow::{bail, Result};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use warren_types::NodeId;

use crate::{blobs, cluster};

#[derive(Debug, Parser)]
#[command(
    name = "warrend",
    version,
    about = "Warren node daemon: sandboxes for RL agents behind an HTTP API"
)]
pub struct Args {
    /// Unix socket to serve the API on.
    #[arg(long, default_value = "/run/warren/warren.sock")]
    pub socket: PathBuf,
    /// Also serve the API on this TCP address: over TLS with --tls-cert/--tls-key, else
    /// plain HTTP on a loopback address only.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Group allowed to use the Unix socket (mode 0660); its members present a token when
    /// --auth is given. Without it only root may connect.
    #[arg(long)]
    pub socket_group: Option<String>,
    #[command(flatten)]
    pub edge: warren_edge::EdgeArgs,
    #[command(flatten)]
    pub log: warren_edge::logging::LogArgs,
    #[command(flatten)]
    pub e2b: warren_e2b::E2bArgs,
    /// Directory of the durable state (state.redb).
    #[arg(long, default_value = "/var/lib/warren")]
    pub state_dir: PathBuf,
    /// The image layer store.
    #[arg(
        long,
        env = "WARREN_IMAGE_STORE",
        default_value = "/var/lib/warren/images"
    )]
    pub image_store: PathBuf,
    /// This node's id (1-16 chars of [a-z0-9]); it prefixes every sandbox id and names the
    /// node's cgroups, so it must be unique on the host.
    #[arg(long, default_value = "n1")]
    pub node: NodeId,
    /// The warren-agent executable (default: next to this executable).
    #[arg(long)]
    pub agent: Option<PathBuf>,
    /// Most sandboxes this node holds at once.
    #[arg(long, default_value_t = 10_000)]
    pub max_sandboxes: usize,
    /// Trajectory budget of a sandbox whose request names none, in MiB (at most 32): output
    /// of later calls is logged as sha256 and size only.
    #[arg(long, default_value_t = warren_types::sandbox::DEFAULT_TRAJECTORY_MB,
          value_parser = clap::value_parser!(u64).range(1..=32))]
    pub trajectory_mb: u64,
    /// Where every sandbox's trajectory is shipped, in segments at most about a second
    /// behind its calls, and sealed when the sandbox is deleted: a directory, file://DIR or
    /// s3://BUCKET/PREFIX (as --blob-store). A trajectory the node no longer has is read
    /// from it.
    #[arg(long, env = "WARREN_TRAJECTORY_STORE", value_name = "URL")]
    pub trajectory_store: Option<String>,
    /// Once the node's state (state.redb and the output files of trajectory-blobs/) is this
    /// large, in MiB, no output is kept in any trajectory (digests and sizes only).
    #[arg(long, default_value_t = warren_node::config::DEFAULT_STATE_MAX_BYTES >> 20)]
    pub state_max_mb: u64,
    /// Lifetime of a sandbox created without a ttl: 30m, 12h, 7d (a plain number is
    /// seconds), or `none` (it lives until deleted, or --max-ttl). The default, a day, keeps
    /// the sandboxes of a trainer that died from living forever; it is capped by --max-ttl.
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_TTL, value_parser = ttl_or_none)]
    pub default_ttl: OptionalSecs,
    /// Longest lifetime a create or an extension may give a sandbox: 1d, 30d. A sandbox
    /// created without a ttl (and no --default-ttl) gets this one.
    #[arg(long, value_name = "DURATION", value_parser = warren_types::units::parse_whole_secs)]
    pub max_ttl: Option<u64>,
    /// Timeout of a command whose exec request names none: 10m, 1h (a plain number is
    /// seconds). Default: none.
    #[arg(long, value_name = "DURATION", value_parser = warren_types::units::parse_secs)]
    pub default_exec_timeout: Option<f64>,
    /// Most sandboxes starting at once; more creates are refused with `busy` (429).
    #[arg(long, default_value_t = 64)]
    pub max_starting: u64,
    /// Most sandboxes held that are not starting; more creates are refused with `busy`.
    #[arg(long, default_value_t = 10_000)]
    pub max_running: u64,
    /// Refuse new sandboxes (`busy`) while the host has less memory available, in MiB.
    #[arg(long, default_value_t = 256)]
    pub min_free_memory_mb: u64,
    #[command(flatten)]
    pub cluster: cluster::ClusterArgs,
    /// Working directory of the microvm and vm substrates: sandboxes' disks and sockets,
    /// templates, base disks (default: STATE_DIR/vm). Daemons may share one.
    #[arg(long, env = "WARREN_VM_DIR")]
    pub vm_dir: Option<PathBuf>,
    /// Guest kernel and modules of the VM substrates (scripts/build-guest.sh).
    #[arg(long, default_value = "/var/cache/warren/guest/current")]
    pub guest_kernel: PathBuf,
    /// VM acceleration: auto (KVM when a guest really boots with it, else TCG), kvm or tcg.
    #[arg(long, env = "WARREN_VM_ACCEL", default_value = "auto", value_parser = ["auto", "kvm", "tcg"])]
    pub vm_accel: String,
    /// Create VMs by restoring a per-machine-shape template snapshot instead of booting.
    #[arg(long, env = "WARREN_VM_TEMPLATES", default_value_t = true, action = clap::ArgAction::Set)]
    pub vm_templates: bool,
    #[command(flatten)]
    pub blobs: blobs::BlobArgs,
    /// Warm containers each function pool keeps while in use.
    #[arg(long, default_value_t = 2)]
    pub function_min_warm: usize,
    /// Most containers of one function pool.
    #[arg(long, default_value_t = 32)]
    pub function_max_warm: usize,
    /// Most calls waiting per function pool (more are refused with `busy`).
    #[arg(long, default_value_t = 512)]
    pub function_queue: usize,
    /// Longest a call waits for a warm container, in milliseconds, before `busy`.
    #[arg(long, default_value_t = 10_000)]
    pub function_queue_timeout_ms: u64,
    /// Cap on the memory limits of all warm function containers, in MiB. Default: half the
    /// host's memory (at most 64 GiB); never more than the host has.
    #[arg(long)]
    pub function_max_memory_mb: Option<u64>,
    /// A pool whose calls wait for their call environments grows only while the node's CPU
    /// pressure (PSI `some avg10`, percent) is at most this; 100 ignores the pressure.
    #[arg(long, default_value_t = 40.0, value_parser = pressure_percent)]
    pub function_max_cpu_pressure: f64,
    /// Do not put sandboxes into a Landlock domain (it is applied best effort by the
    /// kernel's ABI otherwise).
    #[arg(long)]
    pub no_landlock: bool,
    /// Sandbox agents kept started ahead of creates (each a parked process of a few MiB); a
    /// create takes one instead of waiting for an agent to start. 0 turns this off.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub agent_spares: u16,
    /// Leave the cgroup v2 mount's options as they are. By default the daemon sets
    /// `favordynmods` on it (kept after it stops, for the whole host): moving each new
    /// sandbox's agent into its cgroups then does not wait for an RCU grace period, at the
    /// cost of slightly slower forks and exits.
    #[arg(long)]
    pub keep_cgroup_options: bool,
    /// Where containers' writable layers live on disk: a directory of a btrfs with quotas
    /// on, or the mount point of the file-backed btrfs the daemon makes beside it
    /// (`DIR.img`). Default: `<image store>/mnt/writable`.
    #[arg(long)]
    pub writable_dir: Option<PathBuf>,
    /// Size of the file-backed writable-layer file system the daemon makes where DIR cannot
    /// hold quotas, in MiB (a sparse file; only made once).
    #[arg(long, default_value_t = warren_runtime::container::DEFAULT_WRITABLE_MB)]
    pub writable_size_mb: u64,
    /// The disk quotas of all sandboxes on disk may add up to this many times the
    /// writable-layer file system's size; a create beyond it is refused (busy). 1 backs every
    /// quota with space; more makes quotas limits rather than reservations.
    #[arg(long, default_value_t = warren_runtime::container::DEFAULT_DISK_OVERCOMMIT, value_parser = overcommit_ratio)]
    pub disk_overcommit: f64,
    /// Where a container's writable layer lives when its create request does not say:
    /// `disk` (with a quota) or `memory` (a tmpfs charged to its memory). `memory` also
    /// turns the writable-layer file system off.
    #[arg(long, default_value = "disk", value_parser = disk_medium)]
    pub disk_medium: warren_types::DiskMedium,
    /// First host uid of the range (2^30 uids) that owns sandboxes' user namespaces, one uid
    /// per sandbox (a hash of its id): the kernel charges the counts of `/proc/sys/user/*`
    /// (inotify instances and watches, ...) per owner, so each sandbox has its own instead
    /// of sharing host root's. 0 makes them as host root (shared counts).
    #[arg(long, default_value_t = 1 << 31)]
    pub sandbox_owner_uid_base: u32,
    /// A limit of each sandbox's own user namespace, `NAME=VALUE` with NAME a count of
    /// `/proc/sys/user/` (e.g. `max_inotify_watches=65536`); repeatable. The host's per-user
    /// limit applies to each sandbox on top.
    #[arg(long, value_parser = warren_runtime::container::UserLimit::parse)]
    pub sandbox_user_limit: Vec<warren_runtime::container::UserLimit>,
    /// Admit container sandboxes whose memory exceeds the host's (by default such a create is
    /// refused, as for VMs: `invalid_request`).
    #[arg(long)]
    pub memory_overcommit: bool,
    /// Host uid/gid of the first sandbox id range: each container sandbox gets 65,536 host ids
    /// of its own from the pool starting here (a multiple of 65536). Two daemons on one host
    /// need pools of their own; the pool must not overlap the owner uids
    /// (--sandbox-owner-uid-base).
    #[arg(long, default_value_t = 1 << 24)]
    pub id_pool_base: u32,
    /// Number of 65,536-id ranges in the pool (the most container sandboxes at once); 0 maps
    /// every sandbox to the one shared range at 100000.
    #[arg(long, default_value_t = 16_384)]
    pub id_ranges: u32,
    /// Print the AppArmor profile for this node's sandboxes (paths from the other options)
    /// and exit; load it with `apparmor_parser -r`.
    #[arg(long)]
    pub apparmor_profile: bool,
    /// Network configuration (TOML, or JSON by extension): named services, static host
    /// entries, the sandbox address pool, the upstream resolver. Without it, policies can
    /// still allow raw networks and domains (pool 10.200.0.0/16).
    #[arg(long)]
    pub network_config: Option<PathBuf>,
}

fn overcommit_ratio(s: &str) -> Result<f64> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && (0.01..=1000.0).contains(&r) => Ok(r),
        _ => bail!("{s:?} is not a ratio between 0.01 and 1000"),
    }
}

fn disk_medium(s: &str) -> Result<warren_types::DiskMedium> {
    match s {
        "disk" => Ok(warren_types::DiskMedium::Disk),
        "memory" => Ok(warren_types::DiskMedium::Memory),
        _ => bail!("{s:?}: the medium is `disk` or `memory`"),
    }
}

/// A percentage from 0 to 100.
fn pressure_percent(s: &str) -> Result<f64> {
    match s.parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => bail!("{s:?} is not a percentage from 0 to 100"),
    }
}

/// `--default-ttl` when not given: a day.
pub const DEFAULT_TTL: &str = "24h";

/// A duration in seconds or none; `builtin` when it is [`DEFAULT_TTL`] (not the operator's).
#[derive(Debug, Clone, Copy)]
pub struct OptionalSecs {
    pub secs: Option<u64>,
    pub builtin: bool,
}

/// `none` (or 0): no lifetime; else a duration.
pub fn ttl_or_none(s: &str) -> Result<OptionalSecs, warren_types::units::UnitError> {
    if s == "none" {
        return Ok(OptionalSecs {
            secs: None,
            builtin: false,
        });
    }
    let secs = warren_types::units::parse_whole_secs(s)?;
    Ok(OptionalSecs {
        secs: Some(secs).filter(|&n| n > 0),
        builtin: s == DEFAULT_TTL,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_lifetime_is_a_day_and_can_be_none() {
        let d = ttl_or_none(DEFAULT_TTL).unwrap();
        assert_eq!((d.secs, d.builtin), (Some(86_400), true));
        let n = ttl_or_none("none").unwrap();
        assert_eq!((n.secs, n.builtin), (None, false));
        assert_eq!(ttl_or_none("0").unwrap().secs, None);
        assert_eq!(ttl_or_none("30m").unwrap().secs, Some(1_800));
        assert!(ttl_or_none("-1h").is_err());
    }

    #[test]
    fn values_out_of_range_are_refused_with_what_is_expected() {
        assert_eq!(overcommit_ratio("2.5").unwrap(), 2.5);
        assert!(overcommit_ratio("0")
            .unwrap_err()
            .to_string()
            .contains("between 0.01 and 1000"));
        assert!(overcommit_ratio("NaN").is_err());
        assert_eq!(
            disk_medium("memory").unwrap(),
            warren_types::DiskMedium::Memory
        );
        assert!(disk_medium("ssd")
            .unwrap_err()
            .to_string()
            .contains("`disk` or `memory`"));
        assert_eq!(pressure_percent("100").unwrap(), 100.0);
        assert!(pressure_percent("101").is_err());
        let e = Args::try_parse_from(["warrend", "--disk-overcommit", "0"]).unwrap_err();
        assert!(e.to_string().contains("between 0.01 and 1000"), "{e}");
    }
}
