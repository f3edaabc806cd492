//! The image store's host mounts at a daemon's SIGTERM: the last daemon of a store that stops
//! with no sandbox left takes every mount under `mnt/` down (layers, the writable-layer file
//! system and its loop device, the shared sysfs); a daemon whose sandboxes keep running, or
//! that shares the store with a daemon still running, leaves them to those. Each test has an
//! image store of its own (no other test's daemon may use it).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{private_store, test_root, wait_for, Daemon};

/// Mount points under the store's `mnt/`, from this process's mount table.
fn mounts(store: &Path) -> Vec<String> {
    warren_sys::mount::mounts_under(&store.join("mnt"))
}

/// Loop devices whose backing file is in the store (the writable-layer file system's).
fn loop_devices(store: &Path) -> Vec<String> {
    let store = store.to_string_lossy().into_owned();
    let Ok(rd) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            backing
                .trim()
                .starts_with(&store)
                .then(|| e.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// A private store that is unmounted and removed when the test ends, whatever happened (the
/// daemons are dropped first: declare it before them).
struct Store(PathBuf);

impl Store {
    fn new(name: &str) -> Store {
        let dir = test_root().join(format!(
            "store-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        let _ = std::fs::create_dir_all(&dir);
        Store(private_store(&dir))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        for m in mounts(&self.0) {
            let _ = warren_sys::mount::umount(Path::new(&m), true);
        }
        if mounts(&self.0).is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// The mounts a daemon with a sandbox makes: the sandbox's layer(s), the writable-layer file
/// system and the shared sysfs.
fn assert_in_use(store: &Path, what: &str) {
    let m = mounts(store);
    let mnt = store.join("mnt");
    for expected in ["writable", "sysfs"] {
        let p = mnt.join(expected).to_string_lossy().into_owned();
        assert!(m.contains(&p), "{what}: {p} is not mounted: {m:?}");
    }
    assert!(
        m.iter()
            .any(|p| Path::new(p).file_name().is_some_and(|n| n.len() >= 64
                && n.to_string_lossy()[..64]
                    .chars()
                    .all(|c| c.is_ascii_hexdigit()))),
        "{what}: no layer is mounted: {m:?}"
    );
}

/// Waits for the writable-layer file system's loop device to go (it is released when the last
/// mount namespace holding it, a parked agent's, is gone).
async fn assert_no_loop_device(store: &Path) {
    let gone = wait_for(Duration::from_secs(30), || async {
        loop_devices(store).is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "loop devices of {} are left: {:?}",
        store.display(),
        loop_devices(store)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_daemon_to_stop_with_no_sandbox_unmounts_the_store() {
    let store = Store::new("last");
    let Some(mut a) = Daemon::start_on_store(store.0.clone(), |_| Vec::new()).await else {
        return;
    };
    let Some(mut b) = Daemon::start_on_store(store.0.clone(), |_| Vec::new()).await else {
        return;
    };
    let id = a.sandbox().await;
    assert_eq!(a.sh_ok(&id, "echo ok > /root/f; cat /root/f").await, "ok\n");
    assert_in_use(&store.0, "with a sandbox");
    a.client().delete(&id).await.expect("deleting the sandbox");

    // Another daemon uses the store: the mounts stay for it.
    let status = a.stop().await;
    assert!(status.success(), "warrend exited with {status}");
    assert_in_use(&store.0, "after the first of two daemons stopped");
    let id = b.sandbox().await;
    assert_eq!(b.sh_ok(&id, "echo ok").await, "ok\n");
    b.client().delete(&id).await.expect("deleting the sandbox");

    // The last one, with no sandbox left: nothing of the store stays mounted.
    let status = b.stop().await;
    assert!(status.success(), "warrend exited with {status}");
    assert_eq!(
        mounts(&store.0),
        Vec::<String>::new(),
        "mounts left after the last daemon's SIGTERM; log:\n{}",
        b.log_tail(20)
    );
    assert!(
        b.log_tail(40).contains("image store mounts removed"),
        "{}",
        b.log_tail(40)
    );
    assert_no_loop_device(&store.0).await;

    // The next start mounts again and serves.
    b.spawn().await;
    let id = b.sandbox().await;
    assert_eq!(b.sh_ok(&id, "echo again").await, "again\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_stopping_with_sandboxes_keeps_the_store_mounted() {
    let store = Store::new("kept");
    let Some(mut d) = Daemon::start_on_store(store.0.clone(), |_| Vec::new()).await else {
        return;
    };
    let id = d.sandbox().await;
    d.sh_ok(&id, "echo kept > /root/note").await;
    let status = d.stop().await;
    assert!(status.success(), "warrend exited with {status}");
    assert_in_use(&store.0, "after SIGTERM with a sandbox running");
    assert!(
        d.log_tail(40).contains("image store mounts kept"),
        "{}",
        d.log_tail(40)
    );

    // The sandbox lives on its mounts, and the next daemon adopts it.
    d.spawn().await;
    assert_eq!(d.sh_ok(&id, "cat /root/note").await, "kept\n");
    d.client().delete(&id).await.expect("deleting the sandbox");
    let status = d.stop().await;
    assert!(status.success(), "warrend exited with {status}");
    assert_eq!(
        mounts(&store.0),
        Vec::<String>::new(),
        "mounts left once the sandbox was gone; log:\n{}",
        d.log_tail(20)
    );
    assert_no_loop_device(&store.0).await;
}
