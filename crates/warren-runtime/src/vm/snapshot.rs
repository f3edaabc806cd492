//! Snapshots and templates.
//!
//! A snapshot is a directory: `snapshot.json` (format version, the machine it fits),
//! `memory` (QEMU's migration stream written with `migrate` to `file:`, `mapped-ram` so RAM
//! pages sit at fixed offsets and zero pages are never written) and `disk.qcow2` (the
//! writable disk as it was, an overlay of the same base). Saving stops the vCPUs, lifts the
//! migration bandwidth limit, migrates, copies the disk, and (for a live sandbox) continues.
//!
//! A template is a snapshot of a freshly booted VM at "agent ready", one per machine shape,
//! under `templates/<digest of the machine key>`; later sandboxes restore it.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::record::{
    MachineKey, Snapshot, SnapshotMeta, CAPABILITIES, SNAPSHOT_FORMAT, TEMPLATE_HOSTNAME,
};
use super::{create, Vm, VmRuntime};
use crate::{Instance, RuntimeError, SandboxSpec};

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
    if dir.exists() {
        return Err(RuntimeError::Vmm(format!(
            "{} already exists",
            dir.display()
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
        q.set_capabilities(&CAPABILITIES).await?;
        q.unlimit_bandwidth().await?;
        q.migrate(&format!("file:{}", tmp.join("memory").display()))
            .await?;
        q.wait_migration(Duration::from_secs(120)).await?;
        // The disk is consistent now: the migration flushed it and QEMU stopped using it.
        super::disk::copy(&vm.dir().join("disk.qcow2"), &tmp.join("disk.qcow2")).await?;
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
    let vm = Arc::new(create::boot(rt, &tspec, layers, None).await?);
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
    tracing::info!(
        template = digest,
        substrate = key.substrate,
        memory_mb = key.memory_mb,
        boot_and_save_ms = t0.elapsed().as_millis() as u64,
        "VM template made"
    );
    Ok(snap)
}
