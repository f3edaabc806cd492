//! Pruning at daemon start: guest initramfs files of other agent or kernel builds, and
//! templates whose inputs are gone (another QEMU, kernel, initramfs or machine layout), so
//! upgrades do not pile up files in the VM directory.
//!
//! Daemons may share the directory: nothing a process has open goes (each daemon keeps its
//! initramfs open for its life; a VM keeps its template's disk open), nor a template used
//! within [`super::snapshot::TEMPLATE_GRACE`].

use std::path::{Path, PathBuf};

use super::record::{MachineKey, Snapshot, MACHINE_LAYOUT};
use super::snapshot::{in_use, TEMPLATE_GRACE};

/// What this daemon's templates are made of.
pub struct Current<'a> {
    pub kernel: &'a str,
    pub qemu: &'a str,
}

/// Removes `initramfs-*.cpio` files of `boot` other than the current one that no process
/// has open. Returns what was removed.
pub fn initramfs(boot: &Path, current: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(boot) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("initramfs-") && name.ends_with(".cpio")) || p == current {
            continue;
        }
        if !in_use(&p) && std::fs::remove_file(&p).is_ok() {
            removed.push(p);
        }
    }
    removed
}

/// Why a template cannot serve this daemon any more, if it cannot.
fn stale(key: &MachineKey, boot: &Path, cur: &Current<'_>) -> Option<String> {
    if key.layout != MACHINE_LAYOUT {
        return Some(format!("machine layout {}", key.layout));
    }
    if key.qemu != cur.qemu {
        return Some(format!("QEMU {}", key.qemu));
    }
    if key.kernel != cur.kernel {
        return Some(format!("guest kernel {}", key.kernel));
    }
    if !boot.join(&key.initramfs).is_file() {
        return Some(format!("initramfs {} (gone)", key.initramfs));
    }
    None
}

/// Removes templates of `root/templates` that are stale for this daemon (or unreadable, but
/// not half-written ones: reconciliation ages those out), unless recently used or open.
/// Returns each removed template with why.
pub fn templates(root: &Path, cur: &Current<'_>) -> Vec<(PathBuf, String)> {
    let boot = root.join("boot");
    let Ok(rd) = std::fs::read_dir(root.join("templates")) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for e in rd.flatten() {
        let dir = e.path();
        if !dir.is_dir() || dir.extension().is_some() {
            continue;
        }
        let why = match Snapshot::open(&dir) {
            Ok(s) => match stale(&s.meta.machine, &boot, cur) {
                Some(w) => w,
                None => continue,
            },
            Err(e) => e.to_string(),
        };
        let recent = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < TEMPLATE_GRACE);
        if recent || in_use(&dir) {
            continue;
        }
        if std::fs::remove_dir_all(&dir).is_ok() {
            removed.push((dir, why));
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::record::{SnapshotMeta, SNAPSHOT_FORMAT};

    fn key(initramfs: &str, qemu: &str) -> MachineKey {
        MachineKey {
            layout: MACHINE_LAYOUT,
            substrate: "microvm".into(),
            layers: vec![],
            memory_mb: 256,
            cpus: 1,
            disk_mb: 1024,
            accel: "tcg".into(),
            kernel: "k1".into(),
            initramfs: initramfs.into(),
            qemu: qemu.into(),
            nic: false,
        }
    }

    fn template(root: &Path, name: &str, k: MachineKey, age_secs: u64) -> PathBuf {
        let d = root.join("templates").join(name);
        std::fs::create_dir_all(&d).unwrap();
        let meta = SnapshotMeta {
            format: SNAPSHOT_FORMAT,
            substrate: "microvm".into(),
            machine: k,
            created_ms: 0,
            save_secs: 0.1,
            ram_file: true,
        };
        std::fs::write(d.join("snapshot.json"), serde_json::to_vec(&meta).unwrap()).unwrap();
        let t = std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs);
        std::fs::File::open(&d).unwrap().set_modified(t).unwrap();
        d
    }

    #[test]
    fn old_initramfs_and_stale_templates_go_current_and_open_ones_stay() {
        let root = tempfile::tempdir().unwrap();
        let boot = root.path().join("boot");
        std::fs::create_dir_all(&boot).unwrap();
        for n in [
            "initramfs-new.cpio",
            "initramfs-old.cpio",
            "initramfs-held.cpio",
            "empty.cpio",
        ] {
            std::fs::write(boot.join(n), b"x").unwrap();
        }
        // Another live daemon keeps its own initramfs open.
        let _held = std::fs::File::open(boot.join("initramfs-held.cpio")).unwrap();
        let current = boot.join("initramfs-new.cpio");
        let gone = initramfs(&boot, &current);
        assert_eq!(gone, vec![boot.join("initramfs-old.cpio")]);
        for n in ["initramfs-new.cpio", "initramfs-held.cpio", "empty.cpio"] {
            assert!(boot.join(n).exists(), "{n} was removed");
        }

        let hour = 3600;
        let good = template(root.path(), "good", key("initramfs-new.cpio", "q1"), hour);
        let held = template(root.path(), "held", key("initramfs-held.cpio", "q1"), hour);
        let old_agent = template(
            root.path(),
            "oldagent",
            key("initramfs-old.cpio", "q1"),
            hour,
        );
        let old_qemu = template(
            root.path(),
            "oldqemu",
            key("initramfs-new.cpio", "q0"),
            hour,
        );
        let recent = template(root.path(), "recent", key("initramfs-old.cpio", "q0"), 1);
        let open = template(root.path(), "open", key("initramfs-new.cpio", "q0"), hour);
        std::fs::write(open.join("disk.qcow2"), b"d").unwrap();
        let _vm = std::fs::File::open(open.join("disk.qcow2")).unwrap();
        let cur = Current {
            kernel: "k1",
            qemu: "q1",
        };
        let mut gone: Vec<PathBuf> = templates(root.path(), &cur)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        gone.sort();
        assert_eq!(gone, vec![old_agent, old_qemu]);
        for d in [good, held, recent, open] {
            assert!(d.exists(), "{} was removed", d.display());
        }
    }
}
