//! `density --curve`: host memory per idle sandbox at several counts in one run (1,000, 2,000,
//! 5,000, 10,000 by default), with the kernel slab's share, and the time to create and to delete
//! them all. Sandboxes are added step by step and stay alive, so every point is measured with
//! all the earlier sandboxes still there (the kernel's per-memory-cgroup tables grow with the
//! number of sandboxes alive). Before each step the host's `MemAvailable` must cover the step
//! with a margin; otherwise the run stops there rather than push the machine into the OOM killer.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;

use super::delete_all_reporting;
use super::measure::{create_many, Setup, BENCH_LABEL};
use crate::table::Table;

/// `MemAvailable` kept free after a step's estimated need, in KiB: other work on the host and
/// the daemon's own refusal threshold (`--min-free-memory-mb`) live in it.
const RESERVE_KIB: u64 = 2 << 20;

/// What one step cost is assumed before anything was measured, in KiB per sandbox.
const FIRST_GUESS_KIB: u64 = 2 << 10;

/// The `/proc/meminfo` fields the curve reads, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    pub total_kib: u64,
    pub available_kib: u64,
    pub slab_kib: u64,
    pub sunreclaim_kib: u64,
    /// For the breakdown (docs/density.md): 0 where the kernel does not report the field.
    pub kernel_stack_kib: u64,
    pub page_tables_kib: u64,
    pub percpu_kib: u64,
    pub anon_kib: u64,
    pub shmem_kib: u64,
}

impl MemInfo {
    /// The report's figures of the host's memory; the curve needs the slab fields.
    fn from_host(m: &warren_runtime::procfs::MemInfo) -> Option<MemInfo> {
        Some(MemInfo {
            total_kib: m.total_kib,
            available_kib: m.available_kib,
            slab_kib: m.slab_kib?,
            sunreclaim_kib: m.sunreclaim_kib?,
            kernel_stack_kib: m.kernel_stack_kib.unwrap_or(0),
            page_tables_kib: m.page_tables_kib.unwrap_or(0),
            percpu_kib: m.percpu_kib.unwrap_or(0),
            anon_kib: m.anon_kib.unwrap_or(0),
            shmem_kib: m.shmem_kib.unwrap_or(0),
        })
    }

    #[cfg(test)]
    pub fn parse(text: &str) -> Option<MemInfo> {
        MemInfo::from_host(&warren_runtime::procfs::MemInfo::parse(text).ok()?)
    }

    fn read() -> anyhow::Result<MemInfo> {
        MemInfo::from_host(&warren_runtime::procfs::MemInfo::read()?)
            .context("/proc/meminfo lacks Slab/SUnreclaim")
    }

    fn used_kib(&self) -> u64 {
        self.total_kib.saturating_sub(self.available_kib)
    }
}

/// Bytes held by each slab cache (active objects × object size), from `/proc/slabinfo`
/// (readable by root only: empty otherwise).
pub fn slab_caches(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("slabinfo"))
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?;
            let active: u64 = f.next()?.parse().ok()?;
            let _total = f.next()?;
            let size: u64 = f.next()?.parse().ok()?;
            Some((name.to_string(), active * size))
        })
        .collect()
}

fn read_slab_caches() -> BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/slabinfo")
        .map(|t| slab_caches(&t))
        .unwrap_or_default()
}

/// The slab caches that grew most from `start` to `now`, in KiB per sandbox, largest first.
fn top_growth(
    start: &BTreeMap<String, u64>,
    now: &BTreeMap<String, u64>,
    n: f64,
    keep: usize,
) -> Vec<(String, f64)> {
    let mut g: Vec<(String, f64)> = now
        .iter()
        .map(|(k, &v)| {
            let before = start.get(k).copied().unwrap_or(0);
            (k.clone(), (v as f64 - before as f64) / 1024.0 / n)
        })
        .filter(|(_, d)| *d > 0.0)
        .collect();
    g.sort_by(|a, b| b.1.total_cmp(&a.1));
    g.truncate(keep);
    g
}

/// One point of the curve: everything measured with `sandboxes` idle sandboxes alive.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub sandboxes: usize,
    /// Seconds this step took to create its sandboxes.
    pub step_create_secs: f64,
    /// Host memory used (`MemTotal - MemAvailable`) above the start, per sandbox.
    pub mib_per_sandbox: f64,
    /// Slab above the start, per sandbox; and its unreclaimable part.
    pub slab_mib_per_sandbox: f64,
    pub sunreclaim_mib_per_sandbox: f64,
    /// Slab growth over memory growth (0..1; 0 when memory did not grow).
    pub slab_share: f64,
    /// KiB per sandbox above the start: kernel stacks, page tables, per-CPU data, anonymous
    /// memory, shared memory (tmpfs files).
    pub kernel_stack_kib_per_sandbox: f64,
    pub page_tables_kib_per_sandbox: f64,
    pub percpu_kib_per_sandbox: f64,
    pub anon_kib_per_sandbox: f64,
    pub shmem_kib_per_sandbox: f64,
    /// The slab caches that grew most, KiB per sandbox (empty without access to slabinfo).
    pub slab_top_kib_per_sandbox: Vec<(String, f64)>,
    pub meminfo: MemInfo,
}

impl Point {
    fn at(sandboxes: usize, step_create_secs: f64, start: &MemInfo, now: MemInfo) -> Point {
        let n = sandboxes.max(1) as f64;
        let per = |after: u64, before: u64| (after as f64 - before as f64) / 1024.0 / n;
        let used = per(now.used_kib(), start.used_kib());
        let slab = per(now.slab_kib, start.slab_kib);
        let kib = |after: u64, before: u64| per(after, before) * 1024.0;
        Point {
            sandboxes,
            step_create_secs,
            mib_per_sandbox: used,
            slab_mib_per_sandbox: slab,
            sunreclaim_mib_per_sandbox: per(now.sunreclaim_kib, start.sunreclaim_kib),
            slab_share: if used > 0.0 { slab / used } else { 0.0 },
            kernel_stack_kib_per_sandbox: kib(now.kernel_stack_kib, start.kernel_stack_kib),
            page_tables_kib_per_sandbox: kib(now.page_tables_kib, start.page_tables_kib),
            percpu_kib_per_sandbox: kib(now.percpu_kib, start.percpu_kib),
            anon_kib_per_sandbox: kib(now.anon_kib, start.anon_kib),
            shmem_kib_per_sandbox: kib(now.shmem_kib, start.shmem_kib),
            slab_top_kib_per_sandbox: Vec::new(),
            meminfo: now,
        }
    }
}

/// The whole curve.
#[derive(Debug, Clone, Serialize)]
pub struct Curve {
    pub requested: Vec<usize>,
    pub points: Vec<Point>,
    /// Why the run stopped before the last requested point (memory, a refused create).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<String>,
    pub start: MemInfo,
    pub create_secs: f64,
    pub delete_secs: f64,
    pub created: usize,
    /// Host memory used above the start once everything was deleted, in MiB.
    pub mib_left_after_delete: f64,
    /// Sandboxes of this run still listed after deleting them all.
    pub left_after_delete: usize,
}

impl Curve {
    /// Memory per sandbox at the largest point over that at the smallest.
    pub fn flatness(&self) -> Option<f64> {
        let (first, last) = (self.points.first()?, self.points.last()?);
        (self.points.len() >= 2 && first.mib_per_sandbox > 0.0)
            .then(|| last.mib_per_sandbox / first.mib_per_sandbox)
    }

    pub fn render(&self) -> String {
        let mut t = Table::new([
            "SANDBOXES",
            "MiB/SANDBOX",
            "SLAB MiB",
            "SUNRECLAIM MiB",
            "SLAB SHARE",
            "STEP CREATE s",
            "MemAvailable MiB",
        ]);
        for p in &self.points {
            t.row([
                p.sandboxes.to_string(),
                format!("{:.3}", p.mib_per_sandbox),
                format!("{:.3}", p.slab_mib_per_sandbox),
                format!("{:.3}", p.sunreclaim_mib_per_sandbox),
                format!("{:.0}%", p.slab_share * 100.0),
                format!("{:.1}", p.step_create_secs),
                (p.meminfo.available_kib / 1024).to_string(),
            ]);
        }
        let mut out = t.render();
        let mut b = Table::new([
            "SANDBOXES",
            "KSTACK KiB",
            "PAGETABLES KiB",
            "PERCPU KiB",
            "ANON KiB",
            "SHMEM KiB",
            "TOP SLAB CACHES KiB",
        ]);
        for p in &self.points {
            let top: Vec<String> = p
                .slab_top_kib_per_sandbox
                .iter()
                .take(4)
                .map(|(k, v)| format!("{k} {v:.0}"))
                .collect();
            b.row([
                p.sandboxes.to_string(),
                format!("{:.1}", p.kernel_stack_kib_per_sandbox),
                format!("{:.1}", p.page_tables_kib_per_sandbox),
                format!("{:.1}", p.percpu_kib_per_sandbox),
                format!("{:.1}", p.anon_kib_per_sandbox),
                format!("{:.1}", p.shmem_kib_per_sandbox),
                top.join(", "),
            ]);
        }
        out.push('\n');
        out.push_str(&b.render());
        out.push_str(&format!(
            "density curve: {} created in {:.1} s ({:.0}/s), deleted in {:.1} s ({:.0}/s); \
             {:.0} MiB above the start after delete; {} left after delete\n",
            self.created,
            self.create_secs,
            rate(self.created, self.create_secs),
            self.delete_secs,
            rate(self.created, self.delete_secs),
            self.mib_left_after_delete,
            self.left_after_delete
        ));
        if let Some(f) = self.flatness() {
            out.push_str(&format!(
                "density curve: per sandbox at the largest point / at the smallest = {f:.2}\n"
            ));
        }
        if let Some(why) = &self.stopped_by {
            out.push_str(&format!("density curve: stopped early: {why}\n"));
        }
        out
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Whether `more` sandboxes at `per_kib` each fit into `available_kib` with the reserve left.
pub fn fits(available_kib: u64, more: usize, per_kib: u64) -> Result<(), NoRoom> {
    let need_kib = (more as u64).saturating_mul(per_kib);
    if available_kib >= need_kib.saturating_add(RESERVE_KIB) {
        Ok(())
    } else {
        Err(NoRoom {
            more,
            need_kib,
            per_kib,
            available_kib,
        })
    }
}

/// The next step of the curve would leave less than the reserve free.
#[derive(Debug, thiserror::Error)]
#[error(
    "{more} more sandboxes need about {} MiB ({per_kib} KiB each as measured so far, with a \
     margin) and {} MiB must stay free, but MemAvailable is {} MiB",
    need_kib / 1024,
    RESERVE_KIB / 1024,
    available_kib / 1024
)]
pub struct NoRoom {
    pub more: usize,
    pub need_kib: u64,
    pub per_kib: u64,
    pub available_kib: u64,
}

/// The counts to measure: sorted, without duplicates or zero.
pub fn points(requested: &[usize]) -> Vec<usize> {
    let mut p: Vec<usize> = requested.iter().copied().filter(|&n| n > 0).collect();
    p.sort_unstable();
    p.dedup();
    p
}

pub async fn curve(s: &Setup, requested: &[usize], concurrency: usize) -> anyhow::Result<Curve> {
    let targets = points(requested);
    anyhow::ensure!(
        !targets.is_empty(),
        "--curve needs at least one count above 0"
    );
    s.note(format!(
        "density curve: {targets:?} idle sandboxes, {concurrency} creates at a time"
    ));
    let start = MemInfo::read()?;
    let start_slabs = read_slab_caches();
    let mut ids: Vec<String> = Vec::new();
    let mut out = Vec::new();
    let mut stopped_by = None;
    let mut create_secs = 0.0;
    let mut per_kib = FIRST_GUESS_KIB;
    for &target in &targets {
        s.stop.check()?;
        let more = target - ids.len();
        let now = MemInfo::read()?;
        if let Err(why) = fits(now.available_kib, more, per_kib) {
            s.note(format!("density curve: not going to {target}: {why}"));
            stopped_by = Some(format!("before {target}: {why}"));
            break;
        }
        let t = Instant::now();
        let (made, _failed, refused, _secs) =
            create_many(s, "density-curve", more, concurrency, true).await?;
        let step_secs = t.elapsed().as_secs_f64();
        create_secs += step_secs;
        ids.extend(made);
        if let Some(e) = refused {
            stopped_by = Some(format!("a create was refused at {}: {e}", ids.len()));
            break;
        }
        // Let page cache and slab settle after the burst before reading.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let mut p = Point::at(ids.len(), step_secs, &start, MemInfo::read()?);
        p.slab_top_kib_per_sandbox =
            top_growth(&start_slabs, &read_slab_caches(), ids.len() as f64, 8);
        s.note(format!(
            "density curve: {} alive, {:.3} MiB each ({:.0}% slab)",
            p.sandboxes,
            p.mib_per_sandbox,
            p.slab_share * 100.0
        ));
        // The next step is assumed to cost half as much again per sandbox (the cost grows).
        per_kib = per_kib.max((p.mib_per_sandbox.max(0.0) * 1024.0 * 1.5) as u64);
        out.push(p);
    }
    let created = ids.len();
    s.note(format!("density curve: deleting {created}"));
    let t = Instant::now();
    delete_all_reporting(&s.client, ids, concurrency.clamp(1, 64)).await?;
    let delete_secs = t.elapsed().as_secs_f64();
    let labels = BTreeMap::from([(BENCH_LABEL.to_string(), s.run_id.clone())]);
    let left = s
        .client
        .list(&labels, None)
        .await
        .context("listing after delete")?
        .len();
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let end = MemInfo::read()?;
    Ok(Curve {
        requested: targets,
        points: out,
        stopped_by,
        start,
        create_secs,
        delete_secs,
        created,
        mib_left_after_delete: (end.used_kib() as f64 - start.used_kib() as f64) / 1024.0,
        left_after_delete: left,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str =
        "MemTotal:       24576000 kB\nMemFree: 1 kB\nMemAvailable:   20480000 kB\n\
                           Slab:     700000 kB\nSReclaimable: 600000 kB\nSUnreclaim:  100000 kB\n";

    #[test]
    fn meminfo_fields() {
        let m = MemInfo::parse(MEMINFO).unwrap();
        assert_eq!(m.used_kib(), 4_096_000);
        assert_eq!((m.slab_kib, m.sunreclaim_kib), (700_000, 100_000));
        assert!(MemInfo::parse("MemTotal: 5 kB\nMemAvailable: 1 kB\n").is_none());
        assert!(MemInfo::parse("MemTotal: 5 kB\nSlab: 1 kB\nSUnreclaim: 1 kB\n").is_none());
    }

    #[test]
    fn slabinfo_and_growth() {
        let text = "slabinfo - version: 2.1\n# name <active_objs> <num_objs> <objsize> ...\n\
                    kmalloc-1k 100 120 1024 16 4 : tunables 0 0 0 : slabdata 1 1 0\n\
                    dentry 10 20 192 21 1 : tunables 0 0 0 : slabdata 1 1 0\n";
        let a = slab_caches(text);
        assert_eq!(a["kmalloc-1k"], 102_400);
        assert_eq!(a["dentry"], 1920);
        let mut b = a.clone();
        b.insert("kmalloc-1k".into(), 102_400 + 10 * 1024 * 1024);
        b.insert("dentry".into(), 0);
        let top = top_growth(&a, &b, 10.0, 8);
        assert_eq!(top, [("kmalloc-1k".to_string(), 1024.0)]);
    }

    #[test]
    fn point_arithmetic() {
        let start = MemInfo::parse(MEMINFO).unwrap();
        let now = MemInfo {
            available_kib: start.available_kib - 1024 * 1000,
            slab_kib: start.slab_kib + 256 * 1000,
            sunreclaim_kib: start.sunreclaim_kib + 128 * 1000,
            ..start
        };
        let p = Point::at(1000, 3.0, &start, now);
        assert!((p.mib_per_sandbox - 1.0).abs() < 1e-9);
        assert!((p.slab_mib_per_sandbox - 0.25).abs() < 1e-9);
        assert!((p.sunreclaim_mib_per_sandbox - 0.125).abs() < 1e-9);
        assert!((p.slab_share - 0.25).abs() < 1e-9);
    }

    #[test]
    fn steps_that_do_not_fit_are_refused() {
        assert!(fits(10 << 20, 1000, 2048).is_ok());
        let why = fits(3 << 20, 1000, 2048).unwrap_err().to_string();
        assert!(why.contains("MemAvailable is 3072 MiB"), "{why}");
        assert!(fits(1 << 40, usize::MAX, u64::MAX).is_err());
    }

    #[test]
    fn points_are_sorted_and_unique() {
        assert_eq!(points(&[5000, 1000, 0, 2000, 1000]), [1000, 2000, 5000]);
        assert!(points(&[0]).is_empty());
    }

    #[test]
    fn flatness_needs_two_points() {
        let start = MemInfo::parse(MEMINFO).unwrap();
        let at = |n: usize, used_mib: u64| {
            Point::at(
                n,
                1.0,
                &start,
                MemInfo {
                    available_kib: start.available_kib - used_mib * 1024,
                    ..start
                },
            )
        };
        let mut c = Curve {
            requested: vec![1000, 2000],
            points: vec![at(1000, 500)],
            stopped_by: None,
            start,
            create_secs: 1.0,
            delete_secs: 1.0,
            created: 1000,
            mib_left_after_delete: 0.0,
            left_after_delete: 0,
        };
        assert_eq!(c.flatness(), None);
        c.points.push(at(2000, 1100));
        assert!((c.flatness().unwrap() - 1.1).abs() < 1e-9);
        let text = c.render();
        assert!(text.contains("0.500") && text.contains("0.550"), "{text}");
        assert!(text.contains("= 1.10"), "{text}");
    }
}
