//! cgroups, v1, v2 and hybrid: one group per sandbox in every hierarchy Warren uses, so a
//! sandbox is owned, limited, measured and killed by its cgroup.
//!
//! Layout: `<hierarchy mount>/warren-<node>/<sandbox id>`. On cgroup v2 the controllers are
//! enabled down the tree. On v1/hybrid, the memory, cpu, pids and freezer hierarchies are
//! used, plus the v2 `unified` mount when present (for `cgroup.kill`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use warren_types::Limits;

use crate::{RuntimeError, StartCause, Usage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctl {
    Memory,
    Cpu,
    Pids,
    Freezer,
    /// A v2 hierarchy (the only one on v2 hosts, the `unified` one on hybrid hosts).
    Unified,
}

/// The host's cgroup hierarchies Warren uses.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    /// (controller, parent dir of sandbox groups)
    parents: Vec<(Ctl, PathBuf)>,
    v2_only: bool,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RuntimeError {
    let what = what.into();
    move |e| RuntimeError::io(what, e)
}

/// What [`favor_moves`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FavorMoves {
    /// The v2 hierarchy at this mount point already had `favordynmods`.
    AlreadySet(PathBuf),
    /// Warren set it on the v2 hierarchy at this mount point.
    Set(PathBuf),
    /// No cgroup v2 hierarchy is mounted (a v1-only host): nothing was changed.
    NoV2,
}

/// Turns on the cgroup v2 option `favordynmods`, keeping the hierarchy's other options.
///
/// Every create moves its agent into the sandbox's group of each hierarchy (`cgroup.procs`;
/// v1 hierarchies have no `CLONE_INTO_CGROUP`). A move takes the kernel's global
/// `cgroup_threadgroup_rwsem` for writing, and without this option that waits for an RCU grace
/// period: usually 0.1–0.3 ms for a create's moves, but 5–17 ms in some states of a host
/// (seen right after a machine's set-up, and beside other work). With it, writers do not wait
/// and forks and exits (the readers) take a slightly slower path. The lock is one for all
/// hierarchies, so setting it on the v2 mount covers the v1 ones too. The option stays after
/// the daemon stops (it is the host's, like a sysctl).
pub fn favor_moves() -> Result<FavorMoves, RuntimeError> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(io("read mountinfo"))?;
    let Some((mp, opts)) = v2_mount(&info) else {
        return Ok(FavorMoves::NoV2);
    };
    if opts.iter().any(|o| o == "favordynmods") {
        return Ok(FavorMoves::AlreadySet(mp));
    }
    let mut flags: Vec<&str> = opts
        .iter()
        .map(String::as_str)
        .filter(|o| !matches!(*o, "rw" | "ro"))
        .collect();
    flags.push("favordynmods");
    warren_sys::mount::reconfigure_flags(&mp, &flags).map_err(StartCause::CgroupOptions)?;
    Ok(FavorMoves::Set(mp))
}

/// The first cgroup v2 mount in `mountinfo`: its mount point and super block options.
fn v2_mount(mountinfo: &str) -> Option<(PathBuf, Vec<String>)> {
    mountinfo.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        let mp = pre.split(' ').nth(4)?;
        let mut post = post.split(' ');
        (post.next()? == "cgroup2").then_some(())?;
        let opts = post.nth(1).unwrap_or("");
        Some((
            PathBuf::from(mp),
            opts.split(',')
                .filter(|o| !o.is_empty())
                .map(str::to_string)
                .collect(),
        ))
    })
}

impl Hierarchy {
    /// Finds the mounted hierarchies and creates the node's parent groups.
    pub fn detect(group: &str) -> Result<Self, RuntimeError> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(io("read mountinfo"))?;
        let mut parents = Vec::new();
        let mut v2_root: Option<PathBuf> = None;
        for line in info.lines() {
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mp = pre.split(' ').nth(4).unwrap_or("");
            let mut post = post.split(' ');
            let fstype = post.next().unwrap_or("");
            let opts = post.nth(1).unwrap_or("");
            if fstype == "cgroup2" {
                v2_root.get_or_insert_with(|| PathBuf::from(mp));
            } else if fstype == "cgroup" {
                let o: Vec<&str> = opts.split(',').collect();
                for (name, ctl) in [
                    ("memory", Ctl::Memory),
                    ("cpu", Ctl::Cpu),
                    ("pids", Ctl::Pids),
                    ("freezer", Ctl::Freezer),
                ] {
                    if o.contains(&name) && !parents.iter().any(|(c, _)| *c == ctl) {
                        parents.push((ctl, PathBuf::from(mp)));
                    }
                }
            }
        }
        let v2_only = parents.is_empty();
        match (&v2_root, v2_only) {
            (Some(r), _) => parents.push((Ctl::Unified, r.clone())),
            (None, true) => return Err(StartCause::NoCgroups.into()),
            _ => {}
        }
        for (ctl, p) in parents.iter_mut() {
            let dir = p.join(group);
            std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
            if *ctl == Ctl::Unified && v2_only {
                // Delegate controllers down to the sandbox groups.
                let want = "+cpu +memory +pids";
                for d in [p.as_path(), dir.as_path()] {
                    for c in want.split(' ') {
                        let _ = std::fs::write(d.join("cgroup.subtree_control"), c);
                    }
                }
            }
            *p = dir;
        }
        Ok(Hierarchy { parents, v2_only })
    }

    pub fn describe(&self) -> String {
        let kinds: Vec<String> = self
            .parents
            .iter()
            .map(|(c, p)| format!("{c:?}={}", p.display()))
            .collect();
        format!(
            "cgroup {}: {}",
            if self.v2_only { "v2" } else { "v1/hybrid" },
            kinds.join(" ")
        )
    }

    /// Removes the node's parent groups if no sandbox group is left in them.
    pub fn remove_parents_if_empty(&self) {
        for (_, p) in &self.parents {
            let _ = std::fs::remove_dir(p);
        }
    }

    /// The groups of one sandbox (not created yet).
    pub fn set_for(&self, name: &str) -> CgroupSet {
        CgroupSet {
            dirs: self
                .parents
                .iter()
                .map(|(c, p)| (*c, p.join(name)))
                .collect(),
            v2_only: self.v2_only,
            oom_files: Arc::default(),
        }
    }

    /// Resource use of every sandbox group together (the parents' own figures).
    pub fn total_usage(&self) -> Usage {
        CgroupSet {
            dirs: self.parents.clone(),
            v2_only: self.v2_only,
            oom_files: Arc::default(),
        }
        .usage()
    }

    /// Names of every sandbox group that exists in any hierarchy.
    pub fn list(&self) -> Vec<String> {
        let mut names = Vec::new();
        for (_, p) in &self.parents {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        if !names.contains(&n) {
                            names.push(n);
                        }
                    }
                }
            }
        }
        names
    }
}

/// The leaf group of a sandbox's commands, under the sandbox's memory group: its memory
/// limit is the sandbox's own (`memory_mb`), the sandbox group's is that plus the agent's
/// share, so an OOM kill among the commands never needs the agent's memory and never picks
/// the agent (which is not in the leaf).
pub const COMMANDS_LEAF: &str = "commands";
/// On cgroup v2 a group with child groups that use a controller holds no process: the agent
/// lives in this leaf beside [`COMMANDS_LEAF`].
pub const AGENT_LEAF: &str = "agent";

/// The cgroups of one sandbox.
#[derive(Debug, Clone)]
pub struct CgroupSet {
    dirs: Vec<(Ctl, PathBuf)>,
    v2_only: bool,
    /// The `memory.oom_control` files of the v1 memory group and its leaves, listed at the
    /// first [`CgroupSet::oom_kills`] (after the sandbox's creation made its leaves; only
    /// Warren makes them): that count is read before every command.
    oom_files: Arc<OnceLock<Vec<PathBuf>>>,
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), RuntimeError> {
    std::fs::write(dir.join(file), value)
        .map_err(io(format!("write {value:?} to {}/{file}", dir.display())))
}

fn read_u64(p: PathBuf) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// The value of `key` in a flat-keyed file (`memory.events`, `memory.oom_control`).
fn read_field(p: impl AsRef<Path>, key: &str) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

impl CgroupSet {
    /// Creates the groups and applies the limits.
    pub fn create(&self, limits: &Limits) -> Result<(), RuntimeError> {
        let mem = limits.memory_mb * 1024 * 1024;
        let quota = (limits.cpus * 100_000.0).round().max(1000.0) as u64;
        let best_effort = limits.cpu_class == warren_types::CpuClass::BestEffort;
        for (ctl, dir) in &self.dirs {
            std::fs::create_dir(dir).map_err(io(format!("create {}", dir.display())))?;
            match ctl {
                Ctl::Memory => {
                    write(dir, "memory.limit_in_bytes", &mem.to_string())?;
                    if dir.join("memory.memsw.limit_in_bytes").exists() {
                        let _ = write(dir, "memory.memsw.limit_in_bytes", &mem.to_string());
                    }
                }
                Ctl::Cpu => {
                    write(dir, "cpu.cfs_period_us", "100000")?;
                    write(dir, "cpu.cfs_quota_us", &quota.to_string())?;
                    if best_effort {
                        // The smallest weight the kernel accepts (default 1024).
                        write(dir, "cpu.shares", "2")?;
                    }
                }
                Ctl::Pids => write(dir, "pids.max", &limits.pids.to_string())?,
                Ctl::Freezer => {}
                Ctl::Unified if self.v2_only => {
                    write(dir, "memory.max", &mem.to_string())?;
                    let _ = write(dir, "memory.swap.max", "0");
                    write(dir, "cpu.max", &format!("{quota} 100000"))?;
                    write(dir, "pids.max", &limits.pids.to_string())?;
                    if best_effort {
                        // The smallest weight (default 100), and the group scheduled as
                        // SCHED_IDLE against its siblings where the kernel has `cpu.idle`.
                        write(dir, "cpu.weight", "1")?;
                        if dir.join("cpu.idle").exists() {
                            let _ = write(dir, "cpu.idle", "1");
                        }
                    }
                }
                Ctl::Unified => {}
            }
        }
        Ok(())
    }

    /// Makes the leaf group of the sandbox's commands ([`COMMANDS_LEAF`], memory limit
    /// `memory_mb`) in the hierarchy that has the memory controller, before any process is
    /// in the sandbox's groups. On cgroup v2 the agent's leaf ([`AGENT_LEAF`]) too, as a
    /// group whose children use a controller can hold no process.
    pub fn create_commands_leaf(&self, memory_mb: u64) -> Result<(), RuntimeError> {
        let mem = (memory_mb * 1024 * 1024).to_string();
        for (ctl, dir) in &self.dirs {
            match ctl {
                Ctl::Memory => {
                    let leaf = dir.join(COMMANDS_LEAF);
                    std::fs::create_dir(&leaf).map_err(io(format!("create {}", leaf.display())))?;
                    write(&leaf, "memory.limit_in_bytes", &mem)?;
                    if leaf.join("memory.memsw.limit_in_bytes").exists() {
                        let _ = write(&leaf, "memory.memsw.limit_in_bytes", &mem);
                    }
                }
                Ctl::Unified if self.v2_only => {
                    write(dir, "cgroup.subtree_control", "+memory")?;
                    for name in [AGENT_LEAF, COMMANDS_LEAF] {
                        let leaf = dir.join(name);
                        std::fs::create_dir(&leaf)
                            .map_err(io(format!("create {}", leaf.display())))?;
                    }
                    let leaf = dir.join(COMMANDS_LEAF);
                    write(&leaf, "memory.max", &mem)?;
                    let _ = write(&leaf, "memory.swap.max", "0");
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files of the commands' leaf, opened for writing (by the daemon, so
    /// the kernel checks its credentials when the agent later writes a command's pid, or
    /// `0` from the command itself). Empty when the sandbox has no leaf.
    pub fn open_commands_leaf(&self) -> Result<Vec<std::os::fd::OwnedFd>, RuntimeError> {
        let mut out = Vec::new();
        for (_, dir) in &self.dirs {
            let p = dir.join(COMMANDS_LEAF).join("cgroup.procs");
            if !p.exists() {
                continue;
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .map_err(io(format!("open {}", p.display())))?;
            out.push(f.into());
        }
        Ok(out)
    }

    /// Moves a process into every group (on cgroup v2 into the agent's leaf when the
    /// sandbox has one).
    pub fn add_pid(&self, pid: u32) -> Result<(), RuntimeError> {
        for (_, dir) in &self.dirs {
            let agent = dir.join(AGENT_LEAF);
            let dir = if agent.is_dir() { &agent } else { dir };
            write(dir, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// The group directories of one hierarchy: the sandbox's, then its leaves.
    fn with_leaves(dir: &Path) -> Vec<PathBuf> {
        let mut out = vec![dir.to_path_buf()];
        if let Ok(rd) = std::fs::read_dir(dir) {
            out.extend(
                rd.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        out
    }

    /// Pids in the sandbox, its leaves included (from the first hierarchy).
    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (_, dir) in &self.dirs {
            if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
                for leaf in Self::with_leaves(dir).into_iter().skip(1) {
                    if let Ok(s) = std::fs::read_to_string(leaf.join("cgroup.procs")) {
                        out.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
                    }
                }
                return out;
            }
        }
        out
    }

    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|(_, d)| d.exists())
    }

    /// True if `pid` is in this sandbox's groups.
    pub fn contains(&self, pid: u32) -> bool {
        self.pids().contains(&pid)
    }

    /// Kills every process in the sandbox and waits until none is left: up to 5 s for
    /// processes that are not yet on their way out, and as long as the kernel takes (at most
    /// [`EXIT_WAIT`]) for killed ones that are exiting. The last process of a sandbox tears
    /// its namespaces down as it exits, and freeing a writable layer of a million files takes
    /// the kernel many seconds: that is a delete in progress, not a failure.
    pub async fn kill(&self) -> Result<(), RuntimeError> {
        let unified = self
            .dirs
            .iter()
            .find(|(c, d)| *c == Ctl::Unified && d.join("cgroup.kill").exists());
        let freezer = self.dirs.iter().find(|(c, _)| *c == Ctl::Freezer);
        let started = std::time::Instant::now();
        // The time spent waiting for processes that were not exiting.
        let mut stuck = Duration::ZERO;
        let mut round = 0u64;
        loop {
            let pids = self.pids();
            if pids.is_empty() {
                return Ok(());
            }
            let exiting = pids.iter().all(|p| exiting(*p));
            if !exiting {
                stuck += Duration::from_millis(10);
            }
            if stuck > Duration::from_secs(5) || started.elapsed() > EXIT_WAIT {
                return Err(RuntimeError::io(
                    "kill sandbox",
                    std::io::Error::other(format!("processes left: {pids:?}")),
                ));
            }
            if round.is_multiple_of(10) && !exiting {
                if let Some((_, d)) = unified {
                    let _ = write(d, "cgroup.kill", "1");
                } else {
                    // Freeze first so nothing forks while we kill.
                    if let Some((_, d)) = freezer {
                        let _ = write(d, "freezer.state", "FROZEN");
                    }
                    for p in &pids {
                        let _ = warren_sys::process::kill(*p, libc::SIGKILL);
                    }
                    if let Some((_, d)) = freezer {
                        let _ = write(d, "freezer.state", "THAWED");
                    }
                }
            }
            round += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Removes the (empty) groups, leaves first.
    pub async fn remove(&self) -> Result<(), RuntimeError> {
        let dirs: Vec<PathBuf> = self
            .dirs
            .iter()
            .flat_map(|(_, d)| Self::with_leaves(d).into_iter().rev())
            .collect();
        for dir in &dirs {
            let mut tries = 0;
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if tries < 100 => {
                        let _ = e;
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => return Err(RuntimeError::io(format!("remove {}", dir.display()), e)),
                }
            }
        }
        Ok(())
    }

    fn freezer(&self) -> Option<(bool, &PathBuf)> {
        if let Some((_, d)) = self
            .dirs
            .iter()
            .find(|(c, d)| *c == Ctl::Unified && d.join("cgroup.freeze").exists())
        {
            return Some((true, d));
        }
        self.dirs
            .iter()
            .find(|(c, _)| *c == Ctl::Freezer)
            .map(|(_, d)| (false, d))
    }

    /// True if the sandbox is frozen.
    pub fn is_frozen(&self) -> bool {
        match self.freezer() {
            Some((true, d)) => {
                std::fs::read_to_string(d.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
            }
            Some((false, d)) => {
                std::fs::read_to_string(d.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED")
            }
            None => false,
        }
    }

    /// Freezes (or thaws) every process and waits (up to 5 s) until the kernel says so.
    pub async fn freeze(&self, frozen: bool) -> Result<(), RuntimeError> {
        let Some((v2, d)) = self.freezer() else {
            return Err(crate::Unsupported::NoFreezer.into());
        };
        if v2 {
            write(d, "cgroup.freeze", if frozen { "1" } else { "0" })?;
        } else {
            write(d, "freezer.state", if frozen { "FROZEN" } else { "THAWED" })?;
        }
        for _ in 0..500 {
            let done = if v2 {
                std::fs::read_to_string(d.join("cgroup.events"))
                    .map(|s| {
                        s.lines()
                            .any(|l| l == if frozen { "frozen 1" } else { "frozen 0" })
                    })
                    .unwrap_or(true)
            } else {
                std::fs::read_to_string(d.join("freezer.state"))
                    .map(|s| s.trim() == if frozen { "FROZEN" } else { "THAWED" })
                    .unwrap_or(true)
            };
            if done {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(RuntimeError::io(
            "freeze",
            std::io::Error::other(format!("cgroup {} did not settle", d.display())),
        ))
    }

    /// Resident memory of the sandbox in bytes (processes, page cache, writable layer).
    pub fn memory_bytes(&self) -> u64 {
        self.usage().memory_bytes.unwrap_or(0)
    }

    /// Pushes the memory of every process of the sandbox out of RAM: `process_madvise`
    /// (`MADV_PAGEOUT`) over all their mappings, in parallel pieces ([`crate::pageout`]), then [`CgroupSet::reclaim`]. Anonymous pages
    /// leave RAM only into swap. Blocking: call it off the async runtime's workers.
    pub fn page_out(&self) {
        crate::pageout::page_out(&self.pids());
        self.reclaim();
    }

    /// Asks the kernel to reclaim the sandbox's memory: `memory.reclaim` on v2; on v1, a
    /// brief squeeze of the limit (the kernel reclaims to fit, then the limit is restored).
    pub fn reclaim(&self) {
        for (ctl, d) in &self.dirs {
            match ctl {
                Ctl::Unified if self.v2_only => {
                    let cur = read_u64(d.join("memory.current")).unwrap_or(0);
                    let _ = std::fs::write(d.join("memory.reclaim"), cur.to_string());
                }
                Ctl::Memory => {
                    let Some(limit) = read_u64(d.join("memory.limit_in_bytes")) else {
                        continue;
                    };
                    let usage = read_u64(d.join("memory.usage_in_bytes")).unwrap_or(0);
                    let target = (usage / 10).max(4 << 20);
                    if target < usage {
                        let _ = std::fs::write(d.join("memory.limit_in_bytes"), target.to_string());
                        let _ = std::fs::write(d.join("memory.limit_in_bytes"), limit.to_string());
                    }
                }
                _ => {}
            }
        }
    }

    /// How many processes the OOM killer has killed in the sandbox: one small file, read
    /// before and after every command (the whole [`CgroupSet::usage`] reads seven, among
    /// them `memory.stat`, which the kernel sums up on each read).
    pub fn oom_kills(&self) -> Option<u64> {
        self.dirs.iter().find_map(|(ctl, d)| match ctl {
            Ctl::Memory => match self.oom_files.get() {
                Some(files) => v1_oom_sum(files),
                None => {
                    let files = v1_oom_files(d);
                    let kills = v1_oom_sum(&files);
                    // Kept once the group was there to be listed.
                    if kills.is_some() {
                        let _ = self.oom_files.set(files);
                    }
                    kills
                }
            },
            // Counted up the tree (leaves included) on v2.
            Ctl::Unified if self.v2_only => read_field(d.join("memory.events"), "oom_kill"),
            _ => None,
        })
    }

    /// Memory, CPU and pid counts.
    pub fn usage(&self) -> Usage {
        let mut u = Usage::default();
        for (ctl, d) in &self.dirs {
            match ctl {
                Ctl::Memory => {
                    u.memory_bytes = read_u64(d.join("memory.usage_in_bytes"));
                    u.memory_peak_bytes = read_u64(d.join("memory.max_usage_in_bytes"));
                    // With its children (function cells have groups of their own).
                    u.shmem_bytes = read_field(d.join("memory.stat"), "total_shmem");
                    u.oom_kills = v1_oom_kills(d);
                }
                Ctl::Pids => u.pids = read_u64(d.join("pids.current")),
                Ctl::Cpu => {
                    let acct = d.join("cpuacct.usage");
                    u.cpu_usec = read_u64(acct).map(|ns| ns / 1000);
                }
                Ctl::Unified if self.v2_only => {
                    u.memory_bytes = read_u64(d.join("memory.current"));
                    u.memory_peak_bytes = read_u64(d.join("memory.peak"));
                    u.shmem_bytes = read_field(d.join("memory.stat"), "shmem");
                    u.oom_kills = read_field(d.join("memory.events"), "oom_kill");
                    u.pids = read_u64(d.join("pids.current"));
                    u.cpu_usec = read_field(d.join("cpu.stat"), "usage_usec");
                }
                _ => {}
            }
        }
        if u.cpu_usec.is_none() {
            // A hybrid host whose v1 `cpu` hierarchy has no `cpuacct`: every cgroup2 group
            // counts its CPU time in `cpu.stat` whatever controllers it has.
            u.cpu_usec = self
                .dirs
                .iter()
                .filter(|(ctl, _)| matches!(ctl, Ctl::Unified))
                .find_map(|(_, d)| read_field(d.join("cpu.stat"), "usage_usec"));
        }
        u
    }
}

/// OOM kills of a v1 memory group and its leaves: v1 counts a kill only in the group whose
/// limit was hit.
fn v1_oom_kills(dir: &Path) -> Option<u64> {
    v1_oom_sum(&v1_oom_files(dir))
}

/// The `memory.oom_control` files of a v1 memory group (first) and of its leaves.
fn v1_oom_files(dir: &Path) -> Vec<PathBuf> {
    CgroupSet::with_leaves(dir)
        .into_iter()
        .map(|d| d.join("memory.oom_control"))
        .collect()
}

/// The OOM kills counted in `files` ([`v1_oom_files`]); `None` when the group's own cannot
/// be read.
fn v1_oom_sum(files: &[PathBuf]) -> Option<u64> {
    let (own, leaves) = files.split_first()?;
    let own = read_field(own, "oom_kill")?;
    let leaves: u64 = leaves
        .iter()
        .filter_map(|f| read_field(f, "oom_kill"))
        .sum();
    Some(own + leaves)
}

/// The host's swap in bytes (`SwapTotal`): without it anonymous memory cannot leave RAM.
pub fn swap_total_bytes() -> u64 {
    crate::procfs::MemInfo::read()
        .ok()
        .and_then(|m| m.swap_total_kib)
        .unwrap_or(0)
        * 1024
}

/// The longest a delete waits for a sandbox's killed processes to finish exiting.
pub const EXIT_WAIT: Duration = Duration::from_secs(600);

/// True when process `pid` is on its way out: a zombie, or exiting (`PF_EXITING`), which it
/// stays while the kernel tears down what it was the last user of. A process already gone
/// counts as exiting.
fn exiting(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => exiting_stat(&stat).unwrap_or(false),
        Err(_) => true,
    }
}

/// [`exiting`] from the text of `/proc/<pid>/stat`.
fn exiting_stat(stat: &str) -> Option<bool> {
    const PF_EXITING: u64 = 0x4;
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    let flags: u64 = f.nth(5)?.parse().ok()?;
    Some(matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v2_mount_and_its_super_block_options() {
        let info = "\
24 1 8:1 / / rw,relatime - ext4 /dev/vda rw
30 24 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 24 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
36 24 0:30 / /mnt/again rw - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot";
        let (mp, opts) = v2_mount(info).unwrap();
        assert_eq!(mp, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(opts, ["rw", "nsdelegate", "memory_recursiveprot"]);
        assert_eq!(v2_mount("30 24 0:26 / /c rw - cgroup cgroup rw,cpu"), None);
    }

    #[test]
    fn a_process_is_exiting_when_a_zombie_or_flagged_so() {
        // pid (comm with ) and spaces) state ppid pgrp session tty tpgid flags ...
        let line = |state: &str, flags: u64| {
            format!("42 (sh) x) {state} 1 42 42 0 -1 {flags} 0 0 0 0 1 2 0 0 20 0 1 0")
        };
        assert_eq!(exiting_stat(&line("R", 0x400000)), Some(false));
        assert_eq!(exiting_stat(&line("D", 0x400004)), Some(true));
        assert_eq!(exiting_stat(&line("Z", 0)), Some(true));
        assert_eq!(exiting_stat("garbage"), None);
        assert!(
            exiting(u32::MAX),
            "a process that is gone is on its way out"
        );
        assert!(!exiting(std::process::id()), "this test is not exiting");
    }
}
