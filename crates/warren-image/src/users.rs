//! The daemons that use a store, so that the last one to stop takes the store's mounts down.
//!
//! Layers are mounted once per host under `mnt/` and shared by every daemon of the store
//! (and by the sandboxes, which outlive their daemon). Each daemon holds `mnt/.users` shared
//! for its whole life ([`ImageStore::user`]); at its stop ([`ImageStore::release_mounts`]) it
//! unmounts everything under `mnt/` (layers, idmapped layers, the shared sysfs, the
//! writable-layer file system) only if it can take that lock exclusively (no other daemon
//! uses the store) and no lease of a sandbox is left (no sandbox, of any daemon, still runs
//! on the store's layers or its writable file system). Otherwise the mounts stay, and the
//! next daemon reuses them.

use nix::fcntl::{Flock, FlockArg};
use std::fs::File;

use crate::gc::is_temp_holder;
use crate::store::ImageStore;
use crate::ImageError;

/// A daemon's use of the store (the shared lock on `mnt/.users`).
pub struct StoreUser {
    lock: Flock<File>,
}

impl std::fmt::Debug for StoreUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreUser")
    }
}

/// What [`ImageStore::release_mounts`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRelease {
    /// Every mount under `mnt/` is gone (these were unmounted).
    Unmounted(Vec<String>),
    /// The mounts stay, for this reason.
    Kept(String),
    /// These could not be unmounted.
    Failed(Vec<String>),
}

/// Holders of leases that need no mount: snapshots (their layers only have to exist).
fn needs_mounts(holder: &str, pid: Option<u32>) -> bool {
    if holder.starts_with("snapshot.") {
        return false;
    }
    if is_temp_holder(holder) {
        // A build or import in progress in a live process.
        return pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
    }
    true
}

impl ImageStore {
    /// Marks this process as a user of the store until the returned value is dropped or
    /// given to [`ImageStore::release_mounts`].
    pub fn user(&self) -> Result<StoreUser, ImageError> {
        let dir = self.root().join("mnt");
        std::fs::create_dir_all(&dir).map_err(|e| ImageError::io("store users lock", e))?;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(".users"))
            .map_err(|e| ImageError::io("store users lock", e))?;
        let lock = Flock::lock(f, FlockArg::LockShared)
            .map_err(|(_, e)| ImageError::io("store users lock", e.into()))?;
        Ok(StoreUser { lock })
    }

    /// At a daemon's stop: unmounts everything under `mnt/` when no other daemon uses the
    /// store and no sandbox holds a lease (see the module's text); else keeps the mounts.
    pub fn release_mounts(&self, user: StoreUser) -> MountRelease {
        if user.lock.relock(FlockArg::LockExclusiveNonblock).is_err() {
            return MountRelease::Kept("another daemon uses the image store".into());
        }
        // New users wait for the exclusive lock, and a new sandbox needs a user: the leases
        // read now stay true until the mounts are gone.
        if let Some((holder, _)) = self
            .leases()
            .into_iter()
            .find(|(h, l)| needs_mounts(h, l.pid))
        {
            return MountRelease::Kept(format!("{holder} holds layers of the store"));
        }
        let _mounting = match self.mount_flock() {
            Ok(l) => l,
            Err(e) => return MountRelease::Kept(e.to_string()),
        };
        let mounts = warren_sys::mount::mounts_under(&self.root().join("mnt"));
        let failed = self.unmount_all();
        if failed.is_empty() {
            MountRelease::Unmounted(mounts)
        } else {
            MountRelease::Failed(failed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_and_finished_temporary_holders_need_no_mounts() {
        assert!(needs_mounts("n1-01m92abc", None));
        assert!(!needs_mounts("snapshot.n1-snap-01m92", None));
        assert!(!needs_mounts("tmp-import-4194303-1", Some(u32::MAX)));
        assert!(needs_mounts("tmp-import-1-1", Some(std::process::id())));
    }

    #[test]
    fn the_last_user_releases_and_another_user_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let a = store.user().unwrap();
        let b = store.user().unwrap();
        assert_eq!(
            store.release_mounts(a),
            MountRelease::Kept("another daemon uses the image store".into())
        );
        assert_eq!(store.release_mounts(b), MountRelease::Unmounted(vec![]));
    }

    #[test]
    fn a_sandbox_lease_keeps_the_mounts_and_a_snapshot_lease_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        store.lease_layers("n1-01sandbox", &[]).unwrap();
        store.lease_layers("snapshot.n1-snap-01", &[]).unwrap();
        assert_eq!(
            store.release_mounts(store.user().unwrap()),
            MountRelease::Kept("n1-01sandbox holds layers of the store".into())
        );
        store.release("n1-01sandbox");
        assert_eq!(
            store.release_mounts(store.user().unwrap()),
            MountRelease::Unmounted(vec![])
        );
    }

    /// Real mounts under `mnt/` (a layer's place and a nested one) all go; nothing else does.
    #[test]
    fn release_unmounts_everything_under_mnt() {
        if !nix::unistd::geteuid().is_root() {
            let why = "mounting needs root";
            assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
            println!("SKIP: {why}");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let user = store.user().unwrap();
        let mnt = dir.path().join("mnt");
        let outside = dir.path().join("outside");
        let layer = mnt.join("ab".repeat(32));
        let nested = layer.join("inner");
        let tmpfs = |p: &std::path::Path| {
            std::fs::create_dir_all(p).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                p,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        };
        tmpfs(&outside);
        tmpfs(&layer);
        tmpfs(&nested);
        let released = store.release_mounts(user);
        let left = warren_sys::mount::mounts_under(&mnt);
        let outside_kept = warren_sys::mount::is_mount_point(&outside);
        let _ = warren_sys::mount::umount(&outside, true);
        for m in &left {
            let _ = warren_sys::mount::umount(std::path::Path::new(m), true);
        }
        let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
        assert_eq!(
            released,
            MountRelease::Unmounted(vec![s(&nested), s(&layer)])
        );
        assert!(left.is_empty(), "{left:?}");
        assert!(outside_kept);
    }
}
