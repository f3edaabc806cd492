//! Snapshots and templates.
//!
//! A snapshot is a directory: `snapshot.json` (format version, the machine it fits),
//! `memory` (QEMU's migration stream written with `migrate` to `file:`, `mapped-ram` so RAM
//! pages sit at fixed offsets and zero pages are never written) and `disk.qcow2` (the
//! writable disk as it was, an overlay of the same base). Saving stops the vCPUs, lifts the
//! migration bandwidth limit, migrates, copies the disk, and (for a live sandbox) continues.
//!
//! A template is a snapshot of a freshly booted VM at "agent ready", one per machine shape,
//! under `templates/<digest of the machine key>`; later sandboxes restore it. Templates are
//! a cache bounded in count and bytes ([`MAX_TEMPLATES`], [`MAX_TEMPLATE_BYTES`]): making a
//! new one removes the least recently used that no process has open, so requests of ever new
//! machine shapes cannot fill the disk.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::RAM_FILE;
use super::record::{
    capabilities, MachineKey, Snapshot, SnapshotMeta, SNAPSHOT_FORMAT, TEMPLATE_HOSTNAME,
};
use super::{create, Vm, VmRuntime};
use crate::{Instance, RuntimeError, SandboxSpec};

/// Most templates kept in a VM directory.
pub const MAX_TEMPLATES: usize = 8;
/// Most bytes (allocated on disk) all templates of a VM directory may take.
pub const MAX_TEMPLATE_BYTES: u64 = 2 << 30;
/// A template used this recently is never pruned (a restore may be about to open it).
pub(super) const TEMPLATE_GRACE: Duration = Duration::from_secs(120);

/// One lock per template being made (for every runtime of the process), so concurrent
/// creations of one machine shape boot it once.
static TEMPLATE_LOCKS: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
> = std::sync::LazyLock::new(Default::default);

/// Saves `vm` into `dir`. With `keep_running` the VM continues afterwards; otherwise it is
/// left stopped (templates: the VM is destroyed next).
pub async fn save(
    rt: &VmRuntime,
    vm: &Vm,
    dir: &Path,
    keep_running: bool,
) -> Result<Snapshot, RuntimeError> {
    let t0 = Instant::now();
    if keep_running && vm.ram.shared_file().is_some() {
        return Err(RuntimeError::Vmm(crate::VmmError::SharedRamKeepRunning));
    }
    if dir.exists() {
        return Err(RuntimeError::Vmm(crate::VmmError::Exists(
            dir.to_path_buf(),
        )));
    }
    // Unique: daemons sharing the directory may save the same template at once; the first
    // rename wins and the others use it.
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let tmp = dir.with_extension(format!("partial-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&tmp)
        .map_err(|e| RuntimeError::io(format!("create {}", tmp.display()), e))?;
    let result = async {
        let q = vm.qmp();
        let was_running = q.status().await? == "running";
        q.stop().await?;
        q.set_capabilities(&capabilities(vm.ram.shared_file().is_some()))
            .await?;
        q.unlimit_bandwidth().await?;
        q.migrate(&format!("file:{}", tmp.join("memory").display()))
            .await?;
        q.wait_migration(Duration::from_secs(120)).await?;
        // The disk is consistent now: the migration flushed it and QEMU stopped using it.
        super::disk::copy(&vm.dir().join("disk.qcow2"), &tmp.join("disk.qcow2")).await?;
        if let Some(ram) = vm.ram.shared_file() {
            // The RAM was left out of the stream: it is this file. The VM stays stopped
            // (a template's VM is destroyed next), so the file no longer changes.
            keep_ram_file(ram, &tmp.join(RAM_FILE)).await?;
        }
        if keep_running && was_running {
            q.cont().await?;
        }
        let _ = rt;
        Ok::<(), RuntimeError>(())
    }
    .await;
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let meta = SnapshotMeta {
        format: SNAPSHOT_FORMAT,
        substrate: vm.machine().substrate.clone(),
        machine: vm.machine().clone(),
        created_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0),
        save_secs: t0.elapsed().as_secs_f64(),
        ram_file: vm.ram.shared_file().is_some(),
    };
    let json = serde_json::to_vec_pretty(&meta).expect("meta serializes");
    std::fs::write(tmp.join("snapshot.json"), json)
        .map_err(|e| RuntimeError::io("write snapshot.json", e))?;
    if let Err(e) = std::fs::rename(&tmp, dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another daemon saved the same template first.
        return Snapshot::open(dir)
            .map_err(|_| RuntimeError::io(format!("rename {}", dir.display()), e));
    }
    Ok(Snapshot {
        dir: dir.to_path_buf(),
        meta,
    })
}

/// Moves a template VM's RAM file into its snapshot and writes it to disk, so that a template
/// found after a host crash is whole.
async fn keep_ram_file(from: &Path, to: &Path) -> Result<(), RuntimeError> {
    std::fs::rename(from, to).map_err(|e| {
        RuntimeError::io(format!("rename {} to {}", from.display(), to.display()), e)
    })?;
    let to = to.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(&to)
            .and_then(|f| f.sync_data())
            .map_err(|e| RuntimeError::io(format!("sync {}", to.display()), e))
    })
    .await
    .map_err(|e| RuntimeError::io("sync task", std::io::Error::other(e.to_string())))?
}

/// The template of the sandbox's machine shape, made (one boot + one snapshot) if missing.
pub async fn template(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
) -> Result<Snapshot, RuntimeError> {
    let key: MachineKey = rt.key(spec, layers).await?;
    let digest = key.digest();
    let dir = rt.cfg.root.join("templates").join(&digest);
    if let Ok(s) = Snapshot::open(&dir) {
        touch(&dir);
        return Ok(s);
    }
    let lock = {
        let mut locks = TEMPLATE_LOCKS.lock().expect("template locks");
        locks.entry(digest.clone()).or_default().clone()
    };
    let _g = lock.lock().await;
    if let Ok(s) = Snapshot::open(&dir) {
        return Ok(s);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let t0 = Instant::now();
    let mut tspec = spec.clone();
    tspec.id = warren_types::SandboxId::generate(&rt.cfg.node);
    tspec.hostname = TEMPLATE_HOSTNAME.to_string();
    let vm = Arc::new(create::boot(rt, &tspec, layers, None, true).await?);
    // Run the commands a first call runs, so their files are in the guest's page cache of
    // the template (a restored VM would otherwise read them from its disks first).
    for argv in [&["true"][..], &["/bin/sh", "-c", "true"][..]] {
        let spec = warren_proto::ExecSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            output_cap: 4096,
            ..Default::default()
        };
        if let Err(e) = vm.agent().exec(spec, None).await {
            tracing::warn!(error = %e, "warming the template's page cache");
        }
    }
    let saved = save(rt, &vm, &dir, false).await;
    if let Err(e) = vm.destroy().await {
        tracing::warn!(error = %e, "cannot remove the template's VM");
    }
    // Another daemon sharing the directory may have saved the same template first.
    let snap = match saved {
        Ok(s) => s,
        Err(e) => Snapshot::open(&dir).map_err(|_| e)?,
    };
    touch(&dir);
    let root = rt.cfg.root.join("templates");
    let removed = tokio::task::spawn_blocking(move || prune_templates(&root, &dir))
        .await
        .unwrap_or_default();
    for r in removed {
        tracing::info!(template = %r.display(), "least recently used VM template removed");
    }
    tracing::info!(
        template = digest,
        substrate = key.substrate,
        memory_mb = key.memory_mb,
        boot_and_save_ms = t0.elapsed().as_millis() as u64,
        "VM template made"
    );
    Ok(snap)
}

/// Marks a template as used now (its directory's mtime orders the pruning).
fn touch(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Bytes a directory's files take on disk (sparse memory files count what is allocated).
fn allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.blocks() * 512)
                .sum()
        })
        .unwrap_or(0)
}

/// True when a process has a file below `dir` open (a VM using the template's disk).
pub(super) fn in_use(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    for p in procs.flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|t| t.starts_with(dir)) {
                return true;
            }
        }
    }
    false
}

/// Removes least recently used templates of `root` beyond [`MAX_TEMPLATES`] or
/// [`MAX_TEMPLATE_BYTES`], never `keep`, one used within [`TEMPLATE_GRACE`], or one a process
/// has open. Returns what was removed.
pub fn prune_templates(root: &Path, keep: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut all: Vec<(std::time::SystemTime, PathBuf, u64)> = rd
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| {
            let used = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (used, e.path(), allocated_bytes(&e.path()))
        })
        .collect();
    // Newest first: what is kept is a prefix.
    all.sort_by_key(|b| std::cmp::Reverse(b.0));
    let now = std::time::SystemTime::now();
    let (mut count, mut bytes) = (0usize, 0u64);
    let mut removed = Vec::new();
    for (used, path, size) in all {
        let fits = count < MAX_TEMPLATES && bytes + size <= MAX_TEMPLATE_BYTES;
        let recent = now.duration_since(used).unwrap_or_default() < TEMPLATE_GRACE;
        if fits || path == keep || recent || in_use(&path) {
            count += 1;
            bytes += size;
            continue;
        }
        if std::fs::remove_dir_all(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_pruned_least_recently_used_first() {
        let root = tempfile::tempdir_in("/tmp").unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let mut dirs = Vec::new();
        for i in 0..MAX_TEMPLATES + 3 {
            let d = root.path().join(format!("t{i:02}"));
            std::fs::create_dir(&d).unwrap();
            std::fs::write(d.join("memory"), vec![1u8; 8192]).unwrap();
            // t00 is the oldest; each later one was used a second after.
            let f = std::fs::File::open(&d).unwrap();
            f.set_modified(old + Duration::from_secs(i as u64)).unwrap();
            dirs.push(d);
        }
        // One old template is open (a VM runs on it): it stays.
        let _open = std::fs::File::open(dirs[1].join("memory")).unwrap();
        let removed = prune_templates(root.path(), &dirs[0]);
        // The 8 most recently used stay; of the 3 older ones, the one being made (`keep`) and
        // the one in use stay too: only t02 goes.
        assert_eq!(removed, vec![dirs[2].clone()]);
        assert!(dirs.iter().enumerate().all(|(i, d)| d.exists() == (i != 2)));
        // Recently used templates are never pruned, whatever their number.
        for d in &dirs[3..] {
            std::fs::File::open(d)
                .unwrap()
                .set_modified(std::time::SystemTime::now())
                .unwrap();
        }
        std::fs::remove_dir_all(&dirs[10]).unwrap();
        assert!(prune_templates(root.path(), &dirs[0]).is_empty());
    }
}
