//! Baselines from other runtimes: runs `scripts/bench-baselines.sh ROOTFS N` and reads the
//! JSON lines it prints (`{"name":..,"p50_ms":..,"p99_ms":..,"n":..}`).
//!
//! The script is found under `$WARREN_REPO`, else in the current directory or one of its
//! parents. The rootfs is `$WARREN_BASELINE_ROOTFS`, else `/var/cache/warren/rootfs-default`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

const SCRIPT: &str = "scripts/bench-baselines.sh";
const DEFAULT_ROOTFS: &str = "/var/cache/warren/rootfs-default";

/// One baseline measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub name: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub n: u64,
}

/// The baseline lines of the script's output; other lines are ignored.
pub fn parse(output: &str) -> Vec<Baseline> {
    output
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect()
}

/// The podman start-to-exit baseline Warren's create is compared with.
pub fn podman_start(baselines: &[Baseline]) -> Option<&Baseline> {
    baselines.iter().find(|b| {
        let n = b.name.to_ascii_lowercase();
        n.contains("podman") && !n.contains("exec")
    })
}

/// The `crun exec` baseline Warren's exec is compared with.
pub fn crun_exec(baselines: &[Baseline]) -> Option<&Baseline> {
    baselines.iter().find(|b| {
        let n = b.name.to_ascii_lowercase();
        n.contains("crun") && n.contains("exec")
    })
}

fn find_script() -> anyhow::Result<PathBuf> {
    if let Some(repo) = std::env::var_os("WARREN_REPO") {
        let p = Path::new(&repo).join(SCRIPT);
        if p.is_file() {
            return Ok(p);
        }
        bail!("WARREN_REPO is set but {} does not exist", p.display());
    }
    let cwd = std::env::current_dir().context("reading the current directory")?;
    for dir in cwd.ancestors() {
        let p = dir.join(SCRIPT);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("cannot find {SCRIPT}: run from the Warren repository or set WARREN_REPO")
}

/// Runs the baseline script with `n` iterations per runtime. Its stderr passes through.
pub async fn run(n: usize) -> anyhow::Result<Vec<Baseline>> {
    let script = find_script()?;
    let rootfs =
        std::env::var("WARREN_BASELINE_ROOTFS").unwrap_or_else(|_| DEFAULT_ROOTFS.to_string());
    eprintln!("bench: running {} {rootfs} {n}", script.display());
    let script_shown = script.display().to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .arg(&script)
            .arg(&rootfs)
            .arg(n.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
    })
    .await
    .context("baseline runner panicked")?
    .with_context(|| format!("cannot run {script_shown}"))?;
    if !output.status.success() {
        bail!("{script_shown} failed ({})", output.status);
    }
    let baselines = parse(&String::from_utf8_lossy(&output.stdout));
    if baselines.is_empty() {
        bail!("{script_shown} printed no baseline lines");
    }
    Ok(baselines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_match() {
        let out = "running crun...\n\
            {\"name\":\"crun-run\",\"p50_ms\":40.5,\"p99_ms\":60,\"n\":50}\n\
            {\"name\":\"crun-exec\",\"p50_ms\":9.0,\"p99_ms\":12,\"n\":50}\n\
            {\"name\":\"podman-run\",\"p50_ms\":300,\"p99_ms\":420,\"n\":50}\n\
            {\"name\":\"bwrap\",\"p50_ms\":3.1,\"p99_ms\":5,\"n\":50}\n\
            {not json}\n";
        let b = parse(out);
        assert_eq!(b.len(), 4);
        assert_eq!(podman_start(&b).unwrap().p50_ms, 300.0);
        assert_eq!(crun_exec(&b).unwrap().p50_ms, 9.0);
        assert!(podman_start(&b[..2]).is_none());
    }
}
