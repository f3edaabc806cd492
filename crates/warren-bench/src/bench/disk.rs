//! `warren-bench disk`: writable layers on disk against the host file system under them.
//!
//! Three figures, each with its baselines of the same run, in alternating rounds (the median
//! of [`ROUNDS`] is reported: a shared host's load moves any single figure by 2× or more):
//! - a sequential write of 1 GiB (`dd bs=4M conv=fsync`) inside a sandbox on disk vs the
//!   same `dd` on the host, in a directory of the file system the node's writable-layer file
//!   lives on (`--host-dir`, default the system's temporary directory), and on the host
//!   straight into the node's writable-layer file system (`--writable-dir`): the floor of the
//!   inside figure without the sandbox;
//! - `git clone --no-local` of a 20,000-file repository the bench makes (inside the sandbox
//!   for the inside figure, on the host for the host one; the making is not timed), and the
//!   same clone on the host through an overlay mount whose upper directory is on the node's
//!   writable-layer file system (default `<store>/mnt/writable`; mounted as the agent mounts a
//!   sandbox's root, `userxattr`): the floor of the inside figure without the sandbox. The
//!   source repository is made settled, as one fetched from anywhere is: one pack, and no
//!   automatic `git gc` (with 20,000 loose objects the commit starts one in the background,
//!   which raced the timed clone and was most of the clone's "sandbox cost" before);
//! - create → first `exec true` p50 of sandboxes on disk vs in memory, alternating.
//!
//! The same shell script runs inside and on the host and times itself (`date +%s%N`), so
//! neither figure includes the API's round trip. The sandbox gets every CPU of the host, as
//! the host's run has. The trees of every round stay until the last round is timed: a host
//! ext4 without a journal scans past inodes freed in the last minutes when it allocates new
//! ones (`recently_deleted`), so a deletion between two rounds would slow the next host clone.

use std::path::{Path, PathBuf};
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
/// Rounds of the write and the clone on each side.
const ROUNDS: usize = 3;

/// What the disk bench measured (medians of [`ROUNDS`] rounds; every round in `rounds`).
#[derive(Debug, Clone, Serialize)]
pub struct DiskBench {
    /// MiB/s of the 1 GiB write inside a sandbox on disk and on the host.
    pub write_inside_mib_s: f64,
    pub write_host_mib_s: f64,
    /// MiB/s of the same write on the host straight into the writable-layer file system
    /// (none where that file system is not there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_host_writable_mib_s: Option<f64>,
    /// Seconds of the clone inside and on the host.
    pub clone_inside_s: f64,
    pub clone_host_s: f64,
    /// Seconds of the clone on the host through an overlay whose upper directory is on the
    /// writable-layer file system (none where that file system is not there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clone_host_overlay_s: Option<f64>,
    /// Every round's figure, in the order taken.
    pub rounds: Vec<DiskRound>,
    /// The writable-layer file system of the host-side floors.
    pub writable_dir: String,
    /// Create → first exec on each medium (alternating creates).
    pub first_exec_disk: Latency,
    pub first_exec_memory: Latency,
    /// Where the host's figures were taken.
    pub host_dir: String,
}

/// One round: the write and the clone on each side.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DiskRound {
    pub write_inside_mib_s: f64,
    pub write_host_mib_s: f64,
    pub write_host_writable_mib_s: Option<f64>,
    pub clone_inside_s: f64,
    pub clone_host_s: f64,
    pub clone_host_overlay_s: Option<f64>,
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

/// Makes a repository of `REPO_FILES` small files at `DIR/src` (one commit, one pack, no
/// automatic gc left running).
fn repo_script(dir: &str) -> String {
    format!(
        "set -e; r={dir}/src; rm -rf $r; mkdir -p $r; cd $r; git init -q; \
         python3 -c '
import os
for d in range({dirs}):
    os.mkdir(f\"d{{d}}\")
    for i in range(100):
        with open(f\"d{{d}}/f{{i}}.py\", \"w\") as f:
            f.write(f\"# file {{d}}/{{i}}\\n\" + \"x = 1\\n\" * (i % 20))
'; git add -A; git -c gc.auto=0 -c maintenance.auto=false -c user.email=b@b -c user.name=b \
         commit -q -m files; git repack -adq; echo ok",
        dirs = REPO_FILES / 100
    )
}

/// Clones the repository `repo_script` made at `DIR/src` into `DIR/dst` (packing and
/// checking out every file) and prints the nanoseconds it took.
fn clone_script(dir: &str) -> String {
    format!(
        "set -e; cd {dir}; rm -rf dst; t0=$(date +%s%N); \
         git clone -q --no-local src dst; t1=$(date +%s%N); echo $((t1 - t0))"
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

/// The host's scratch directories of one run: `DIR/warren-bench-<pid>` under `--host-dir`,
/// and under the writable-layer file system an overlay mount (empty lower, upper and work
/// directories beside it) and a plain directory for the write. All go on drop, whatever
/// happened.
struct HostDirs {
    host: PathBuf,
    /// The writable-layer side, where that file system is there.
    writable: Option<PathBuf>,
    mounted: bool,
}

impl HostDirs {
    fn make(s: &Setup, host_dir: &str, writable_dir: &str) -> anyhow::Result<Self> {
        let name = format!("warren-bench-{}", std::process::id());
        let mut dirs = HostDirs {
            host: Path::new(host_dir).join(&name),
            writable: None,
            mounted: false,
        };
        std::fs::create_dir_all(&dirs.host)
            .with_context(|| format!("mkdir {}", dirs.host.display()))?;
        if !Path::new(writable_dir).is_dir() {
            s.note(format!(
                "disk: no writable-layer file system at {writable_dir}: no host floor figures"
            ));
            return Ok(dirs);
        }
        let base = Path::new(writable_dir).join(&name);
        dirs.writable = Some(base.clone());
        for n in ["lower", "upper", "work", "merged", "plain"] {
            let d = base.join(n);
            std::fs::create_dir_all(&d).with_context(|| format!("mkdir {}", d.display()))?;
        }
        let d = |n: &str| base.join(n).display().to_string();
        host_sh(&format!(
            "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={},userxattr {}",
            d("lower"),
            d("upper"),
            d("work"),
            d("merged")
        ))
        .context("the overlay of the clone's floor")?;
        dirs.mounted = true;
        Ok(dirs)
    }

    fn host(&self) -> String {
        self.host.display().to_string()
    }

    fn writable(&self, n: &str) -> Option<String> {
        self.writable
            .as_ref()
            .map(|b| b.join(n).display().to_string())
    }
}

impl Drop for HostDirs {
    fn drop(&mut self) {
        if let (true, Some(merged)) = (self.mounted, self.writable("merged")) {
            let _ = host_sh(&format!("umount {merged}"));
        }
        let _ = std::fs::remove_dir_all(&self.host);
        if let Some(b) = &self.writable {
            let _ = std::fs::remove_dir_all(b);
        }
    }
}

pub async fn disk(
    s: &Setup,
    rounds: usize,
    host_dir: &str,
    writable_dir: &str,
) -> anyhow::Result<DiskBench> {
    s.note(format!(
        "disk: 1 GiB write and a {REPO_FILES}-file clone inside a sandbox on disk vs on the host ({host_dir}), {ROUNDS} rounds; {rounds} creates per medium"
    ));
    let mut req = s.request("disk");
    req.disk_medium = Some(DiskMedium::Disk);
    // The write's file (twice: a removed file's extents may be counted until the file
    // system's next commit), and every round's source and clone (about 170 MiB each).
    req.disk_mb = Some(WRITE_MB * 2 + 1024);
    req.memory_mb = Some(1024);
    // The host's figures use every CPU (git's pack and checkout run threads): so does the
    // sandbox.
    req.cpus = Some(std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
    let sb = s.client.create(&req).await.context("create")?;
    let measured = match HostDirs::make(s, host_dir, writable_dir) {
        Ok(dirs) => measure_io(s, &sb.id, &dirs).await,
        Err(e) => Err(e),
    };
    s.client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id))?;
    let rounds_io = measured?;
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
    let med = |f: &dyn Fn(&DiskRound) -> f64| median(rounds_io.iter().map(f).collect());
    let med_opt = |f: &dyn Fn(&DiskRound) -> Option<f64>| {
        let v: Vec<f64> = rounds_io.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| median(v))
    };
    Ok(DiskBench {
        write_inside_mib_s: med(&|r| r.write_inside_mib_s),
        write_host_mib_s: med(&|r| r.write_host_mib_s),
        write_host_writable_mib_s: med_opt(&|r| r.write_host_writable_mib_s),
        clone_inside_s: med(&|r| r.clone_inside_s),
        clone_host_s: med(&|r| r.clone_host_s),
        clone_host_overlay_s: med_opt(&|r| r.clone_host_overlay_s),
        rounds: rounds_io,
        writable_dir: writable_dir.to_string(),
        first_exec_disk: Latency::from_samples(disk),
        first_exec_memory: Latency::from_samples(memory),
        host_dir: host_dir.to_string(),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// [`ROUNDS`] rounds of the write and the clone, inside then on the host (then through the
/// floors on the writable-layer file system).
async fn measure_io(s: &Setup, id: &str, dirs: &HostDirs) -> anyhow::Result<Vec<DiskRound>> {
    let mib_s = |ns: f64| WRITE_MB as f64 / (ns / 1e9);
    let mut rounds = Vec::new();
    for r in 0..ROUNDS {
        s.stop.check()?;
        let mut round = DiskRound {
            write_inside_mib_s: mib_s(nanos(&inside(s, id, &write_script("/root")).await?)?),
            write_host_mib_s: mib_s(nanos(&host_sh(&write_script(&dirs.host()))?)?),
            ..Default::default()
        };
        if let Some(plain) = dirs.writable("plain") {
            round.write_host_writable_mib_s = Some(mib_s(nanos(&host_sh(&write_script(&plain))?)?));
        }
        let tree = format!("/root/warren-bench-{r}");
        inside(s, id, &repo_script(&tree)).await?;
        round.clone_inside_s = nanos(&inside(s, id, &clone_script(&tree)).await?)? / 1e9;
        let tree = format!("{}/{r}", dirs.host());
        host_sh(&repo_script(&tree))?;
        round.clone_host_s = nanos(&host_sh(&clone_script(&tree))?)? / 1e9;
        if let Some(merged) = dirs.writable("merged") {
            let tree = format!("{merged}/{r}");
            host_sh(&repo_script(&tree))?;
            round.clone_host_overlay_s = Some(nanos(&host_sh(&clone_script(&tree))?)? / 1e9);
        }
        s.note(format!("disk: round {}: {round:?}", r + 1));
        rounds.push(round);
    }
    Ok(rounds)
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
        let plain = self.write_host_writable_mib_s.map_or(String::new(), |p| {
            format!(
                ", host into {} {p:.0} MiB/s (inside {:.2}× of it)",
                self.writable_dir,
                self.write_inside_mib_s / p
            )
        });
        let overlay = self.clone_host_overlay_s.map_or(String::new(), |o| {
            format!(
                ", host through an overlay on {} {o:.2} s (inside {:.2}× of it)",
                self.writable_dir,
                self.clone_inside_s / o
            )
        });
        format!(
            "disk (medians of {ROUNDS} rounds): 1 GiB write inside {:.0} MiB/s vs host {:.0} MiB/s \
             ({w:.2}×, {}){plain}; \
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
