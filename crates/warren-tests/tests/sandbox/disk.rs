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
