//! `warren-bench disk`: writable layers on disk against the host file system under them.
//!
//! Three figures, each with its baseline of the same run:
//! - a sequential write of 1 GiB (`dd bs=4M conv=fsync`) inside a sandbox on disk vs the
//!   same `dd` on the host, in a directory of the file system the node's writable-layer file
//!   lives on (`--host-dir`, default the system's temporary directory);
//! - `git clone --no-local` of a 20,000-file repository the bench makes (inside the sandbox
//!   for the inside figure, on the host for the host one; the making is not timed), and the
//!   same clone on the host through an overlay mount whose upper directory is on the node's
//!   writable-layer file system (`--writable-dir`, default `<store>/mnt/writable`; mounted as
//!   the agent mounts a sandbox's root, `userxattr`): the floor of the inside figure without
//!   the sandbox;
//! - create → first `exec true` p50 of sandboxes on disk vs in memory, alternating.
//!
//! The same shell script runs inside and on the host and times itself (`date +%s%N`), so
//! neither figure includes the API's round trip. The sandbox gets every CPU of the host, as
//! the host's run has.

use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::ExecRequest;
use warren_types::DiskMedium;

use super::measure::Setup;
use crate::stats::Latency;

/// Bytes of the sequential write, in MiB.
const WRITE_MB: u64 = 1024;
/// Files of the cloned repository.
const REPO_FILES: usize = 20_000;

/// What the disk bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct DiskBench {
    /// MiB/s of the 1 GiB write inside a sandbox on disk and on the host.
    pub write_inside_mib_s: f64,
    pub write_host_mib_s: f64,
    /// Seconds of the clone inside and on the host.
    pub clone_inside_s: f64,
    pub clone_host_s: f64,
    /// Seconds of the clone on the host through an overlay whose upper directory is on the
    /// writable-layer file system (none where that file system is not there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clone_host_overlay_s: Option<f64>,
    /// The writable-layer file system of that figure.
    pub writable_dir: String,
    /// Create → first exec on each medium (alternating creates).
    pub first_exec_disk: Latency,
    pub first_exec_memory: Latency,
    /// Where the host's figures were taken.
    pub host_dir: String,
}

/// Writes `WRITE_MB` MiB to `DIR/warren-bench-write` and prints the nanoseconds it took.
fn write_script(dir: &str) -> String {
    format!(
        "set -e; f={dir}/warren-bench-write; t0=$(date +%s%N); \
         dd if=/dev/zero of=$f bs=4M count={} conv=fsync status=none; \
         t1=$(date +%s%N); rm -f $f; echo $((t1 - t0))",
        WRITE_MB / 4
    )
}

/// Makes a repository of `REPO_FILES` small files at `DIR/warren-bench-src` (one commit).
fn repo_script(dir: &str) -> String {
    format!(
        "set -e; r={dir}/warren-bench-src; rm -rf $r; mkdir -p $r; cd $r; git init -q; \
         python3 -c '
import os
for d in range({dirs}):
    os.mkdir(f\"d{{d}}\")
    for i in range(100):
        with open(f\"d{{d}}/f{{i}}.py\", \"w\") as f:
            f.write(f\"# file {{d}}/{{i}}\\n\" + \"x = 1\\n\" * (i % 20))
'; git add -A; git -c user.email=b@b -c user.name=b commit -q -m files; echo ok",
        dirs = REPO_FILES / 100
    )
}

/// Clones the repository `repo_script` made (packing and checking out every file) and
/// prints the nanoseconds it took.
fn clone_script(dir: &str) -> String {
    format!(
        "set -e; cd {dir}; rm -rf warren-bench-dst; t0=$(date +%s%N); \
         git clone -q --no-local warren-bench-src warren-bench-dst; t1=$(date +%s%N); \
         rm -rf warren-bench-dst warren-bench-src; echo $((t1 - t0))"
    )
}

fn nanos(out: &str) -> anyhow::Result<f64> {
    out.trim()
        .lines()
        .last()
        .and_then(|l| l.trim().parse::<f64>().ok())
        .with_context(|| format!("no time in {out:?}"))
}

/// Runs `script` with `sh` on the host; its stdout.
fn host_sh(script: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new("sh")
        .args(["-c", script])
        .output()
        .context("sh")?;
    anyhow::ensure!(
        out.status.success(),
        "on the host: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn inside(s: &Setup, id: &str, script: &str) -> anyhow::Result<String> {
    let r = s
        .client
        .exec(id, &ExecRequest::argv(["sh", "-c", script]))
        .await?;
    anyhow::ensure!(r.success(), "inside: {} {}", r.stdout, r.stderr);
    Ok(r.stdout)
}

/// The clone on the host through an overlay mount at `DIR/warren-bench-overlay-<pid>/merged`
/// (empty lower, upper and work directories beside it on `dir`'s file system); nanoseconds.
/// The mount and the directories go whatever happens.
fn overlay_clone(dir: &str) -> anyhow::Result<f64> {
    let base =
        std::path::Path::new(dir).join(format!("warren-bench-overlay-{}", std::process::id()));
    let d = |n: &str| base.join(n).display().to_string();
    for n in ["lower", "upper", "work", "merged"] {
        std::fs::create_dir_all(base.join(n)).with_context(|| format!("mkdir {}", d(n)))?;
    }
    let mounted = host_sh(&format!(
        "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={},userxattr {}",
        d("lower"),
        d("upper"),
        d("work"),
        d("merged")
    ));
    let timed = mounted.and_then(|_| {
        host_sh(&repo_script(&d("merged")))?;
        nanos(&host_sh(&clone_script(&d("merged")))?)
    });
    let _ = host_sh(&format!("umount {}", d("merged")));
    let _ = std::fs::remove_dir_all(&base);
    timed
}

pub async fn disk(
    s: &Setup,
    rounds: usize,
    host_dir: &str,
    writable_dir: &str,
) -> anyhow::Result<DiskBench> {
    s.note(format!(
        "disk: 1 GiB write and a {REPO_FILES}-file clone inside a sandbox on disk vs on the host ({host_dir}); {rounds} creates per medium"
    ));
    let mut req = s.request("disk");
    req.disk_medium = Some(DiskMedium::Disk);
    req.disk_mb = Some(WRITE_MB + 1024);
    req.memory_mb = Some(1024);
    // The host's figures use every CPU (git's pack and checkout run threads): so does the
    // sandbox.
    req.cpus = Some(std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
    let sb = s.client.create(&req).await.context("create")?;
    let measured = measure_io(s, &sb.id, host_dir).await;
    s.client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id))?;
    let (write_inside, write_host, clone_inside, clone_host) = measured?;
    let clone_host_overlay = match std::path::Path::new(writable_dir).is_dir() {
        true => Some(overlay_clone(writable_dir).context("the clone through an overlay")?),
        false => {
            s.note(format!(
                "disk: no writable-layer file system at {writable_dir}: no overlay figure"
            ));
            None
        }
    };
    let (mut disk, mut memory) = (Vec::new(), Vec::new());
    for i in 0..rounds.max(1) * 2 {
        s.stop.check()?;
        let medium = if i % 2 == 0 {
            DiskMedium::Disk
        } else {
            DiskMedium::Memory
        };
        let mut req = s.request("disk-create");
        req.disk_medium = Some(medium);
        req.disk_mb = Some(64);
        let t = Instant::now();
        let sb = s.client.create(&req).await.context("create")?;
        let r = s.client.exec(&sb.id, &ExecRequest::argv(["true"])).await?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        anyhow::ensure!(r.success(), "`true` failed: {r:?}");
        s.client.delete(&sb.id).await?;
        if medium == DiskMedium::Disk {
            disk.push(ms);
        } else {
            memory.push(ms);
        }
    }
    let mib_s = |ns: f64| WRITE_MB as f64 / (ns / 1e9);
    Ok(DiskBench {
        write_inside_mib_s: mib_s(write_inside),
        write_host_mib_s: mib_s(write_host),
        clone_inside_s: clone_inside / 1e9,
        clone_host_s: clone_host / 1e9,
        clone_host_overlay_s: clone_host_overlay.map(|n| n / 1e9),
        writable_dir: writable_dir.to_string(),
        first_exec_disk: Latency::from_samples(disk),
        first_exec_memory: Latency::from_samples(memory),
        host_dir: host_dir.to_string(),
    })
}

/// The write and clone, inside then on the host; nanoseconds each.
async fn measure_io(s: &Setup, id: &str, host_dir: &str) -> anyhow::Result<(f64, f64, f64, f64)> {
    let write_inside = nanos(&inside(s, id, &write_script("/root")).await?)?;
    let write_host = nanos(&host_sh(&write_script(host_dir))?)?;
    inside(s, id, &repo_script("/root")).await?;
    let clone_inside = nanos(&inside(s, id, &clone_script("/root")).await?)?;
    host_sh(&repo_script(host_dir))?;
    let clone_host = nanos(&host_sh(&clone_script(host_dir))?)?;
    Ok((write_inside, write_host, clone_inside, clone_host))
}

impl DiskBench {
    /// Inside over host for the write (higher is better) and the clone (lower is better).
    pub fn ratios(&self) -> (f64, f64) {
        (
            self.write_inside_mib_s / self.write_host_mib_s,
            self.clone_inside_s / self.clone_host_s,
        )
    }

    /// The text report.
    pub fn render(&self) -> String {
        let (w, c) = self.ratios();
        let overlay = self.clone_host_overlay_s.map_or(String::new(), |o| {
            format!(
                ", host through an overlay on {} {o:.2} s (inside {:.2}× of it)",
                self.writable_dir,
                self.clone_inside_s / o
            )
        });
        format!(
            "disk: 1 GiB write inside {:.0} MiB/s vs host {:.0} MiB/s ({w:.2}×, {}); \
             git clone of {REPO_FILES} files inside {:.2} s vs host {:.2} s ({c:.2}×){overlay}; \
             create → first exec p50 on disk {:.1} ms vs in memory {:.1} ms\n",
            self.write_inside_mib_s,
            self.write_host_mib_s,
            self.host_dir,
            self.clone_inside_s,
            self.clone_host_s,
            self.first_exec_disk.p50_ms,
            self.first_exec_memory.p50_ms,
        )
    }
}
