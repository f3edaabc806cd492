//! Baselines from other runtimes: runs `scripts/bench-baselines.sh ROOTFS N` and reads the
//! JSON lines it prints (`{"name":..,"p50_ms":..,"p99_ms":..,"n":..}`, or
//! `{"name":..,"error":..}` for a runtime that could not run).
//!
//! The script is compiled into the binary, so `warren bench --baselines` runs anywhere; with
//! `$WARREN_REPO` set, that repository's copy runs instead (to try a changed script). The
//! rootfs is `$WARREN_BASELINE_ROOTFS`, else `/var/cache/warren/rootfs-default`; both are
//! checked before any measuring starts ([`check`]).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

const SCRIPT: &str = "scripts/bench-baselines.sh";
/// The script as built with this binary.
const SHIPPED: &str = include_str!("../../../../scripts/bench-baselines.sh");
const DEFAULT_ROOTFS: &str = "/var/cache/warren/rootfs-default";

/// One baseline measurement, or why it could not be taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The samples' quantiles 0 %, 1 %, …, 100 % in ms, for the CDF of `--report` (empty
    /// from a script that does not print them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quantiles_ms: Vec<f64>,
}

impl Baseline {
    /// The p50 of a baseline that ran.
    pub fn p50(&self) -> Option<f64> {
        self.p50_ms.filter(|_| self.error.is_none())
    }
}

/// The baseline lines of the script's output; other lines are ignored.
pub fn parse(output: &str) -> Vec<Baseline> {
    output
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .filter_map(|l| serde_json::from_str(l.trim()).ok())
        .collect()
}

/// The podman start-to-exit baseline (`podman_run`) Warren's create is compared with.
pub fn podman_start(baselines: &[Baseline]) -> Option<&Baseline> {
    baselines.iter().filter(|b| b.p50().is_some()).find(|b| {
        let n = b.name.to_ascii_lowercase();
        n.contains("podman") && !n.contains("exec")
    })
}

/// The OCI runtime exec baseline Warren's exec is compared with: `crun_exec`, else
/// `runc_exec` (the script falls back to runc where crun cannot run).
pub fn oci_exec(baselines: &[Baseline]) -> Option<&Baseline> {
    let ran = || baselines.iter().filter(|b| b.p50().is_some());
    let named = |rt: &str| {
        ran().find(|b| {
            let n = b.name.to_ascii_lowercase();
            n.contains(rt) && n.contains("exec")
        })
    };
    named("crun").or_else(|| named("runc"))
}

/// The repository's script when `$WARREN_REPO` names one, else `None` (the shipped one).
fn repo_script() -> anyhow::Result<Option<PathBuf>> {
    let Some(repo) = std::env::var_os("WARREN_REPO") else {
        return Ok(None);
    };
    let p = Path::new(&repo).join(SCRIPT);
    if !p.is_file() {
        bail!("WARREN_REPO is set but {} does not exist", p.display());
    }
    Ok(Some(p))
}

fn rootfs() -> String {
    std::env::var("WARREN_BASELINE_ROOTFS").unwrap_or_else(|_| DEFAULT_ROOTFS.to_string())
}

/// What `--baselines` needs, checked before the benchmarks run (they take minutes): the
/// script (when taken from `$WARREN_REPO`) and the root file system the runtimes start.
pub fn check() -> anyhow::Result<()> {
    repo_script()?;
    let rootfs = rootfs();
    if !Path::new(&rootfs).join("bin").exists() {
        bail!(
            "--baselines needs a root file system at {rootfs} (scripts/build-default-image.sh \
             makes it; or set WARREN_BASELINE_ROOTFS)"
        );
    }
    Ok(())
}

/// Runs the baseline script with `n` iterations per runtime. Its stderr passes through.
pub async fn run(n: usize) -> anyhow::Result<Vec<Baseline>> {
    let script = repo_script()?;
    let rootfs = rootfs();
    let script_shown = script
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| format!("{SCRIPT} (built in)"));
    eprintln!("bench: running {script_shown} {rootfs} {n}");
    let output = tokio::task::spawn_blocking(move || {
        let mut cmd = std::process::Command::new("bash");
        match &script {
            Some(p) => cmd.arg(p),
            None => cmd.arg("-c").arg(SHIPPED).arg(SCRIPT),
        };
        cmd.arg(&rootfs)
            .arg(n.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
    })
    .await
    .context("baseline runner panicked")?
    .with_context(|| format!("cannot run {script_shown}"))?;
    // The script fails only when no baseline could run; the lines then say why.
    let baselines = parse(&String::from_utf8_lossy(&output.stdout));
    if baselines.is_empty() {
        bail!(
            "{script_shown} printed no baseline lines ({})",
            output.status
        );
    }
    Ok(baselines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_ships_with_the_binary() {
        assert!(
            SHIPPED.starts_with("#!/usr/bin/env bash"),
            "{}",
            &SHIPPED[..40]
        );
        assert!(SHIPPED.contains("time_cmd"));
    }

    #[test]
    fn lines_parse_and_match() {
        let out = r#"progress...
{"name":"runc_run","runtime":"runc","n":50,"p50_ms":40.5,"p99_ms":60,"mean_ms":41,"min_ms":39}
{"name":"runc_exec","runtime":"runc","n":50,"p50_ms":9.0,"p99_ms":12}
{"name":"podman_run","error":"podman import failed"}
{"name":"bwrap","n":50,"p50_ms":3.1,"p99_ms":5}
{not json}
"#;
        let b = parse(out);
        assert_eq!(b.len(), 4);
        assert_eq!(oci_exec(&b).unwrap().name, "runc_exec");
        assert!(
            podman_start(&b).is_none(),
            "a failed baseline is not compared with"
        );
        let mut with_podman = b.clone();
        with_podman[2] =
            serde_json::from_str(r#"{"name":"podman_run","n":20,"p50_ms":300,"p99_ms":420}"#)
                .unwrap();
        assert_eq!(podman_start(&with_podman).unwrap().p50(), Some(300.0));
        let crun =
            serde_json::from_str(r#"{"name":"crun_exec","n":5,"p50_ms":7,"p99_ms":8}"#).unwrap();
        with_podman.push(crun);
        assert_eq!(oci_exec(&with_podman).unwrap().name, "crun_exec");
        assert!(
            b[0].quantiles_ms.is_empty(),
            "older scripts print no quantiles"
        );
        let q = parse(r#"{"name":"bwrap","n":3,"p50_ms":2,"p99_ms":3,"quantiles_ms":[1,2,3]}"#);
        assert_eq!(q[0].quantiles_ms, [1.0, 2.0, 3.0]);
    }
}
