//! Deleting a sandbox whose writable layer holds a million files: the kernel takes seconds
//! to free them (the layer goes with the sandbox's last process, or with its subvolume), and
//! the delete waits that out. It answers success, and nothing of the sandbox is left.

use warren_client::{CreateSandboxRequest, ExecRequest};
use warren_types::DiskMedium;

use crate::common::{image_store, Daemon};

/// A million empty files in 1,000 directories of `/root`; prints how many.
const MILLION: &str = "import os
n = 0
for d in range(1000):
    os.mkdir(f'/root/d{d}')
    for i in range(1000):
        os.close(os.open(f'/root/d{d}/{i}', os.O_CREAT | os.O_WRONLY)); n += 1
print(n)";

async fn delete_of_a_million_files_leaves_nothing(medium: DiskMedium) {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // An empty file costs about 370 bytes of btrfs metadata on disk, about 1 KiB of kernel
    // memory in a tmpfs (its inode and dentry, charged to the sandbox).
    let (memory_mb, disk_mb) = match medium {
        DiskMedium::Memory => (2048, 2048),
        _ => (512, 1024),
    };
    let info = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(memory_mb),
            disk_mb: Some(disk_mb),
            disk_medium: Some(medium),
            ..Default::default()
        })
        .await;
    let id = info.id;
    let mut make = ExecRequest::argv(["python3", "-c", MILLION]);
    make.timeout_secs = Some(900.0);
    let r = d.exec(&id, &make).await;
    assert!(r.success(), "making a million files: {r:?}");
    assert_eq!(r.stdout.trim(), "1000000");
    let pids = d.sandbox_pids(&id);
    assert!(!pids.is_empty());

    let t = std::time::Instant::now();
    d.client()
        .delete(&id)
        .await
        .unwrap_or_else(|e| panic!("delete after {:?}: {e}", t.elapsed()));
    println!("delete of a million files ({medium:?}): {:?}", t.elapsed());

    // Gone from the API, from the host's processes, cgroups, mounts and writable layers.
    let e = d.client().get(&id).await.expect_err("a deleted sandbox");
    assert!(format!("{e}").contains("not_found"), "{e}");
    assert!(!d.list().await.iter().any(|s| s.id == id));
    for p in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists(),
            "process {p} of the sandbox is left"
        );
    }
    assert!(d.cgroup_dirs(&id).is_empty(), "{:?}", d.cgroup_dirs(&id));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(id.as_str())).collect();
    assert!(left.is_empty(), "mounts of the sandbox are left: {left:#?}");
    let layer = image_store().join("mnt").join("writable").join(&id);
    assert!(!layer.exists(), "{} is left", layer.display());
    // The node serves on.
    let next = d.sandbox().await;
    assert_eq!(d.sh_ok(&next, "echo ok").await, "ok\n");
    d.client().delete(&next).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_million_files_in_memory_leaves_nothing() {
    delete_of_a_million_files_leaves_nothing(DiskMedium::Memory).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_a_million_files_on_disk_leaves_nothing() {
    delete_of_a_million_files_leaves_nothing(DiskMedium::Disk).await
}
