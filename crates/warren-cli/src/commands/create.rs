//! `warren create`: creates one sandbox and prints its id alone on stdout.

use std::collections::BTreeMap;

use anyhow::Context as _;
use warren_client::{CpuClass, CreateSandboxRequest, ImageRef, Substrate};

use super::{parse_kv, Ctx};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Image name; repeat to stack layers, lowest first [default: default]
    #[arg(long, short = 'i')]
    pub image: Vec<String>,
    /// Isolation substrate
    #[arg(long, value_parser = ["function", "container", "microvm", "vm"])]
    pub substrate: Option<String>,
    /// CPU cores (fractions allowed)
    #[arg(long, allow_hyphen_values = true, value_parser = warren_types::units::parse_positive)]
    pub cpus: Option<f64>,
    /// Memory limit: 512M, 1G, 1.5GiB (a plain number is MiB)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = warren_types::units::parse_mib)]
    pub memory: Option<u64>,
    /// Writable layer size: 512M, 10G (a plain number is MiB; with --disk-medium memory at
    /// most --memory)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = warren_types::units::parse_mib)]
    pub disk: Option<u64>,
    /// Where a container's writable layer lives: `disk` (node-local disk with a quota, the
    /// node's default where it has one) or `memory` (a tmpfs charged to --memory)
    #[arg(long, value_name = "MEDIUM", value_parser = ["disk", "memory"])]
    pub disk_medium: Option<String>,
    /// Trajectory budget in MiB: output of later calls is logged as sha256 and size only
    #[arg(long, allow_hyphen_values = true, value_parser = warren_types::units::parse_count)]
    pub trajectory_mb: Option<u64>,
    /// Process limit
    #[arg(long, allow_hyphen_values = true, value_parser = warren_types::units::parse_count)]
    pub pids: Option<u64>,
    /// Best-effort CPU class: lowest CPU weight and SCHED_IDLE, yielding to other sandboxes
    #[arg(long)]
    pub best_effort: bool,
    /// Lifetime, after which the sandbox is deleted: 90s, 5m, 2h (a plain number is seconds)
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = warren_types::units::parse_whole_secs)]
    pub ttl: Option<u64>,
    /// Time without calls after which the sandbox is paused (deleted where the substrate
    /// cannot pause): 90s, 5m (a plain number is seconds)
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = warren_types::units::parse_whole_secs)]
    pub idle_timeout: Option<u64>,
    /// Environment variable for every command (repeatable)
    #[arg(long, short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Label (repeatable)
    #[arg(long, short = 'l', value_name = "K=V", value_parser = parse_kv)]
    pub label: Vec<(String, String)>,
    /// Default working directory of commands
    #[arg(long, short = 'w')]
    pub workdir: Option<String>,
    /// Default user of commands (name or uid[:gid])
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Hostname inside the sandbox
    #[arg(long)]
    pub hostname: Option<String>,
    /// Mount /dev/pts at start, for programs inside that open terminals themselves (without
    /// it, the first `warren shell` mounts it)
    #[arg(long)]
    pub pty: bool,
    /// A repeated create with the same key returns the first sandbox
    #[arg(long)]
    pub idempotency_key: Option<String>,
    /// Network policy as JSON (default "none"); see `warren net` to change it later
    #[arg(long)]
    pub network: Option<String>,
    /// Start from a snapshot (`warren snapshot create`): its substrate, image and limits; a
    /// VM's processes keep running
    #[arg(long)]
    pub snapshot: Option<String>,
    /// Print the new sandbox (SandboxInfo) as JSON instead of its id
    #[arg(long)]
    pub json: bool,
}

/// The request the arguments describe.
pub fn request(args: &Args) -> anyhow::Result<CreateSandboxRequest> {
    let args = args.clone();
    let substrate = match args.substrate.as_deref() {
        None => Substrate::default(),
        Some(s) => serde_json::from_value(serde_json::Value::String(s.to_string()))
            .with_context(|| format!("unknown substrate {s:?}"))?,
    };
    let mut image = args.image;
    let image = match image.len() {
        0 => ImageRef::default(),
        1 => ImageRef::Name(image.remove(0)),
        _ => ImageRef::Stack(image),
    };
    Ok(CreateSandboxRequest {
        substrate,
        image,
        cpus: args.cpus,
        memory_mb: args.memory,
        disk_mb: args.disk,
        disk_medium: args.disk_medium.as_deref().map(|m| match m {
            "memory" => warren_types::DiskMedium::Memory,
            _ => warren_types::DiskMedium::Disk,
        }),
        trajectory_mb: args.trajectory_mb,
        pids: args.pids,
        cpu_class: args.best_effort.then_some(CpuClass::BestEffort),
        env: args.env.into_iter().collect::<BTreeMap<_, _>>(),
        workdir: args.workdir,
        user: args.user,
        ttl_secs: args.ttl,
        idle_timeout_secs: args.idle_timeout,
        labels: args.label.into_iter().collect(),
        idempotency_key: args.idempotency_key,
        hostname: args.hostname,
        pty: args.pty,
        snapshot: args.snapshot,
        network: match args.network.as_deref() {
            None | Some("none") => Default::default(),
            Some(j) => serde_json::from_str(j).context("--network")?,
        },
    })
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let req = request(&args)?;
    let client = ctx.client()?;
    let sandbox = client.create(&req).await.context("create failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&sandbox)?);
    } else {
        println!("{}", sandbox.id);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: Args,
    }

    fn req(argv: &[&str]) -> CreateSandboxRequest {
        let t = T::try_parse_from(std::iter::once("create").chain(argv.iter().copied())).unwrap();
        request(&t.a).unwrap()
    }

    #[test]
    fn images_and_fields() {
        assert_eq!(req(&[]).image, ImageRef::default());
        assert_eq!(req(&["-i", "x"]).image, ImageRef::Name("x".into()));
        assert_eq!(
            req(&["-i", "a", "-i", "b"]).image,
            ImageRef::Stack(vec!["a".into(), "b".into()])
        );
        let r = req(&[
            "--substrate",
            "microvm",
            "--ttl",
            "60",
            "-l",
            "k=v",
            "--memory",
            "64",
        ]);
        assert_eq!(r.substrate, Substrate::Microvm);
        assert_eq!(r.ttl_secs, Some(60));
        assert_eq!(r.labels["k"], "v");
        assert_eq!(r.memory_mb, Some(64));
    }
}
