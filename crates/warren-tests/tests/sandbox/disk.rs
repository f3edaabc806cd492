//! Writable layers on disk (the default for containers): a quota per sandbox, independent of
//! its memory; the memory medium still there; the node's writable-layer space in health and
//! in admission; a restarted node keeps each sandbox's quota; a deleted sandbox's layer goes.

use std::path::PathBuf;

use warren_client::{ClientError, CreateSandboxRequest};
use warren_types::{DiskMedium, ErrorCode};

use crate::common::{image_store, Daemon};

/// Where a sandbox's writable layer lives on the host (`container/writable.rs`).
fn layer_dir(id: &str) -> PathBuf {
    image_store().join("mnt").join("writable").join(id)
}

/// The node's writable-layer space of `/v1/health`.
async fn space(d: &Daemon) -> serde_json::Value {
    let h = d.client().health().await.unwrap();
    let disk = h.extra.get("disk").cloned().unwrap_or_default();
    assert!(
        disk.is_object(),
        "health has no writable-layer space: {h:?}"
    );
    disk
}

fn field(v: &serde_json::Value, name: &str) -> u64 {
    v[name].as_u64().unwrap_or_else(|| panic!("{name} in {v}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_layer_holds_more_than_memory_and_stops_at_its_quota() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let info = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            disk_mb: Some(1024),
            ..Default::default()
        })
        .await;
    let id = info.id;
    assert_eq!(info.limits.disk_medium, DiskMedium::Disk);
    assert!(layer_dir(&id).is_dir(), "no layer directory for {id}");
    // Six times the memory limit goes into the writable layer.
    d.sh_ok(
        &id,
        "dd if=/dev/zero of=/root/big bs=1M count=768 status=none && sync -f /root/big",
    )
    .await;
    let s = d.client().stats(&id).await.unwrap();
    assert!(
        s.disk_bytes.unwrap_or(0) >= 768 << 20,
        "768 MiB written, the layer counts {:?}",
        s.disk_bytes
    );
    // (In memory 768 MiB could not have been written at all: the memory limit is 128 MiB.
    // The cgroup's memory figure holds the page cache of the writes, which it reclaims.)
    // Past the quota: the write fails inside, with the quota's error.
    let over = d
        .sh(
            &id,
            "dd if=/dev/zero of=/root/more bs=1M count=512 status=none 2>&1; echo rc=$?",
        )
        .await;
    assert!(
        over.stdout.contains("quota exceeded") && !over.stdout.contains("rc=0"),
        "a write past disk_mb succeeded: {over:?}"
    );
    // The sandbox keeps answering, and space freed inside can be written again.
    d.sh_ok(&id, "rm /root/more /root/big && sync -f /root")
        .await;
    d.sh_ok(
        &id,
        "dd if=/dev/zero of=/root/again bs=1M count=512 status=none && echo ok",
    )
    .await;
    d.client().delete(&id).await.unwrap();
    assert!(
        !layer_dir(&id).exists(),
        "the deleted sandbox's layer is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_memory_medium_is_a_tmpfs_charged_to_memory() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // In memory a layer larger than the memory is refused; on disk it is not.
    let too_big = CreateSandboxRequest {
        memory_mb: Some(128),
        disk_mb: Some(256),
        disk_medium: Some(DiskMedium::Memory),
        ..Default::default()
    };
    match d.client().create(&too_big).await {
        Err(ClientError::Api { error, .. }) => {
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}")
        }
        other => panic!("a memory layer over memory_mb was not refused: {other:?}"),
    }
    let info = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(128),
            disk_mb: Some(32),
            disk_medium: Some(DiskMedium::Memory),
            ..Default::default()
        })
        .await;
    assert_eq!(info.limits.disk_medium, DiskMedium::Memory);
    assert!(!layer_dir(&info.id).exists());
    let out = d
        .sh(
            &info.id,
            "dd if=/dev/zero of=/root/f bs=1M count=64 status=none 2>&1; echo rc=$?",
        )
        .await;
    assert!(
        out.stdout.contains("No space left") && !out.stdout.contains("rc=0"),
        "{out:?}"
    );
    let s = d.client().stats(&info.id).await.unwrap();
    assert!(
        s.memory_bytes.unwrap_or(0) >= 24 << 20,
        "the tmpfs layer is charged to memory: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_space_is_admitted_shown_and_freed() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let before = space(&d).await;
    let capacity = field(&before, "capacity_bytes");
    assert!(
        capacity > 0 && field(&before, "total_bytes") > 0,
        "{before}"
    );
    // More than half the capacity: one fits, a second cannot now (busy, not invalid).
    let half = (capacity >> 20) / 2 + 1;
    let req = CreateSandboxRequest {
        disk_mb: Some(half),
        ..Default::default()
    };
    let first = d.create(&req).await.id;
    let held = space(&d).await;
    assert_eq!(
        field(&held, "committed_bytes"),
        field(&before, "committed_bytes") + (half << 20),
        "{held}"
    );
    match d.client().create(&req).await {
        Err(ClientError::Api { error, .. }) => {
            assert_eq!(error.code, ErrorCode::Busy, "{error:?}")
        }
        other => panic!("a create past the writable-layer space was admitted: {other:?}"),
    }
    // More than the whole capacity can never fit: invalid.
    let never = CreateSandboxRequest {
        disk_mb: Some((capacity >> 20) + 1),
        ..Default::default()
    };
    match d.client().create(&never).await {
        Err(ClientError::Api { error, .. }) => {
            assert_eq!(error.code, ErrorCode::InvalidRequest, "{error:?}")
        }
        other => panic!("a create past the whole capacity was admitted: {other:?}"),
    }
    d.client().delete(&first).await.unwrap();
    let after = space(&d).await;
    assert_eq!(
        field(&after, "committed_bytes"),
        field(&before, "committed_bytes")
    );
    let (_, _, body) =
        crate::common::raw_request(&d.socket, "GET", "/metrics", None, Vec::new()).await;
    let metrics = String::from_utf8_lossy(&body);
    assert!(
        metrics.contains("warren_writable_capacity_bytes"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_quota_survives_a_daemon_restart() {
    let Some(mut d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            disk_mb: Some(64),
            ..Default::default()
        })
        .await
        .id;
    d.sh_ok(&id, "echo kept > /root/f").await;
    d.restart().await;
    assert!(field(&space(&d).await, "committed_bytes") >= 64 << 20);
    assert_eq!(d.sh_ok(&id, "cat /root/f").await.trim(), "kept");
    let over = d
        .sh(
            &id,
            "dd if=/dev/zero of=/root/big bs=1M count=128 status=none 2>&1; echo rc=$?",
        )
        .await;
    assert!(
        over.stdout.contains("quota exceeded") && !over.stdout.contains("rc=0"),
        "the quota is gone after a restart: {over:?}"
    );
    d.client().delete(&id).await.unwrap();
    assert!(!layer_dir(&id).exists());
}

/// Runs `btrfs ARGS` on the host; its stdout.
fn btrfs(args: &[&str]) -> String {
    let out = std::process::Command::new("btrfs")
        .args(args)
        .output()
        .expect("running btrfs");
    assert!(
        out.status.success(),
        "btrfs {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Bytes quota group `0/<subvol>` of the writable-layer file system refers to, if it exists.
fn qgroup_bytes(subvol: &str) -> Option<u64> {
    let mnt = image_store().join("mnt").join("writable");
    let name = format!("0/{subvol}");
    btrfs(&["qgroup", "show", "--raw", "-r", &mnt.display().to_string()])
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(name.as_str())).then(|| f.next()?.parse().ok())?
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_4g_with_512m_of_memory_holds_3g_and_frees_its_blocks() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(512),
            disk_mb: Some(4096),
            ..Default::default()
        })
        .await
        .id;
    let subvol = btrfs(&[
        "inspect-internal",
        "rootid",
        &layer_dir(&id).display().to_string(),
    ])
    .trim()
    .to_string();
    d.sh_ok(
        &id,
        // `sync -f` commits the file system's transaction: a quota group's count is brought
        // up to date at the commit (an fsync only writes the log).
        "dd if=/dev/zero of=/root/big bs=4M count=768 conv=fsync status=none && sync -f /root",
    )
    .await;
    let s = d.client().stats(&id).await.unwrap();
    assert!(
        s.disk_bytes.unwrap_or(0) >= 3 << 30,
        "3 GiB written, the layer counts {:?}",
        s.disk_bytes
    );
    // The sandbox's own memory stays small: the writes are page cache the kernel reclaims
    // (the limit is 512 MiB), nothing of the layer is resident anonymous memory.
    // cgroup v2 counts it as `anon`, the v1 memory controller as `rss`.
    let anon: u64 = d
        .cgroup_dirs(&id)
        .into_iter()
        .filter_map(|dir| std::fs::read_to_string(dir.join("memory.stat")).ok())
        .find_map(|stat| {
            stat.lines()
                .find_map(|l| l.strip_prefix("anon ").or_else(|| l.strip_prefix("rss ")))
                .and_then(|v| v.trim().parse().ok())
        })
        .expect("anon or rss in the sandbox's memory.stat");
    assert!(anon < 64 << 20, "{anon} bytes of anonymous memory");
    assert!(qgroup_bytes(&subvol).unwrap_or(0) >= 3 << 30);
    // Deleted, its blocks go back to the file system: once the subvolume is cleaned up
    // (`subvolume sync` waits for that) its quota group counts nothing, or is gone.
    d.client().delete(&id).await.unwrap();
    assert!(!layer_dir(&id).exists());
    let mnt = image_store().join("mnt").join("writable");
    btrfs(&["subvolume", "sync", &mnt.display().to_string(), &subvol]);
    let left = qgroup_bytes(&subvol).unwrap_or(0);
    assert!(left < 1 << 20, "the deleted layer still holds {left} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_quota_bounds_inodes_too() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // btrfs quota groups count bytes only, but each inode costs metadata bytes (its item,
    // its directory entries: about 370 bytes on this file system) charged to the same quota
    // group: 8 MiB holds some tens of thousands of empty files, not millions.
    let id = d
        .create(&CreateSandboxRequest {
            disk_mb: Some(8),
            ..Default::default()
        })
        .await
        .id;
    let out = d
        .sh_ok(
            &id,
            "python3 -c '
import os, errno
n = 0
try:
    for d in range(1000):
        os.mkdir(f\"/root/d{d}\")
        for i in range(1000):
            os.close(os.open(f\"/root/d{d}/{i}\", os.O_CREAT | os.O_WRONLY)); n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
else:
    print(n, \"none\")
'",
        )
        .await;
    let mut f = out.split_whitespace();
    let n: u64 = f.next().and_then(|n| n.parse().ok()).expect(&out);
    let err = f.next().unwrap_or_default();
    assert!(
        err == "EDQUOT" || err == "ENOSPC",
        "{n} empty files made, then {err}"
    );
    assert!(n > 1000 && n < 1_000_000, "{n} empty files in 8 MiB");
    // The sandbox keeps answering, and removing files makes room again.
    d.sh_ok(
        &id,
        "rm -rf /root/d0 /root/d1 && sync -f /root && touch /root/again",
    )
    .await;
    d.client().delete(&id).await.unwrap();
}
