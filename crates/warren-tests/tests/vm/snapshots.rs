//! Snapshots of a microVM through the API: saved with its memory and a running process,
//! listed, a sandbox made from it after its source is gone (the file and the process are
//! there, the process still counting), refusals of what it cannot take, delete; nothing left
//! behind (no QEMU, no snapshot directory, no layer lease).

use std::time::Duration;

use crate::memory::daemon_with_microvm;
use crate::qemu_of;
use warren_client::{CreateSandboxRequest, CreateSnapshotRequest, ErrorCode, Substrate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_snapshot_round_trip_keeps_files_and_running_processes() {
    let Some(d) = daemon_with_microvm().await else {
        return;
    };
    let c = d.client();
    let src = d
        .create(&CreateSandboxRequest {
            substrate: Substrate::Microvm,
            memory_mb: Some(256),
            hostname: Some("snapped".into()),
            labels: [("run".to_string(), "a".to_string())].into(),
            ..Default::default()
        })
        .await;
    let sum = d
        .sh_ok(
            &src.id,
            "head -c 2000000 /dev/urandom > /root/data; sha256sum /root/data; \
             (i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count.t; mv /dev/shm/count.t /dev/shm/count; sleep 0.1; done) \
             >/dev/null 2>&1 & echo $! > /root/counter.pid",
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let snap = c
        .snapshot(
            &src.id,
            &CreateSnapshotRequest {
                labels: [("kind".to_string(), "test".to_string())].into(),
            },
        )
        .await
        .expect("snapshot of a microVM");
    assert!(
        snap.id.starts_with(&format!("{}-snap-", d.node)),
        "{}",
        snap.id
    );
    assert_eq!(
        (snap.sandbox.as_str(), snap.substrate, snap.processes),
        (src.id.as_str(), Substrate::Microvm, true)
    );
    assert!(snap.size_bytes > 0);
    assert!(c.snapshots().await.unwrap().iter().any(|s| s.id == snap.id));
    assert_eq!(c.get_snapshot(&snap.id).await.unwrap(), snap);
    // The source logged it and keeps running.
    let log = c.trajectory(&src.id, None).await.unwrap();
    let last = serde_json::to_value(log.last().unwrap()).unwrap();
    assert_eq!(last["kind"], "snapshot", "{last}");
    assert_eq!(d.sh_ok(&src.id, "echo up").await, "up\n");
    c.delete(&src.id).await.unwrap();

    // What it cannot take is refused before anything starts.
    for (req, code) in [
        (
            CreateSandboxRequest {
                snapshot: Some(snap.id.clone()),
                memory_mb: Some(512),
                ..Default::default()
            },
            ErrorCode::InvalidRequest,
        ),
        (
            CreateSandboxRequest {
                snapshot: Some(snap.id.clone()),
                substrate: Substrate::Vm,
                ..Default::default()
            },
            ErrorCode::InvalidRequest,
        ),
        (
            CreateSandboxRequest {
                snapshot: Some(snap.id.clone()),
                network: serde_json::from_str(
                    r#"{"mode":"allow","allow":[{"cidr":"10.254.1.0/24"}]}"#,
                )
                .unwrap(),
                ..Default::default()
            },
            ErrorCode::InvalidRequest,
        ),
        (
            CreateSandboxRequest {
                snapshot: Some(format!("{}-snap-01jd0m7x4e8k0k9yq1w2e3r4t5", d.node)),
                ..Default::default()
            },
            ErrorCode::NotFound,
        ),
        (
            CreateSandboxRequest {
                snapshot: Some("../../etc".into()),
                ..Default::default()
            },
            ErrorCode::NotFound,
        ),
    ] {
        let e = c.create(&req).await.expect_err("refused");
        assert_eq!(e.code(), Some(code), "{req:?}: {e}");
    }
    let left = c.list(&Default::default(), None).await.unwrap();
    assert!(
        left.iter().all(|s| s.id == src.id),
        "a refused create left a sandbox: {left:?}"
    );

    // Two sandboxes from it: the file, the process (same pid) still counting.
    let from = CreateSandboxRequest {
        snapshot: Some(snap.id.clone()),
        ..Default::default()
    };
    let a = d.create(&from).await;
    let b = d.create(&from).await;
    assert_eq!(
        (a.substrate, a.limits.memory_mb, a.image.clone()),
        (Substrate::Microvm, 256, src.image.clone())
    );
    for k in [&a, &b] {
        let got = d
            .sh_ok(
                &k.id,
                "hostname; sha256sum /root/data; kill -0 $(cat /root/counter.pid) && echo alive; \
                 x=$(cat /dev/shm/count); sleep 1; y=$(cat /dev/shm/count); [ $y -gt $x ] && echo counting",
            )
            .await;
        // The hostname is the create's (here the node's default), not the snapshot's.
        assert_eq!(got, format!("sandbox\n{sum}alive\ncounting\n"), "{}", k.id);
        let first = serde_json::to_value(&c.trajectory(&k.id, None).await.unwrap()[0]).unwrap();
        assert_eq!(first["kind"], "forked_from", "{first}");
        assert_eq!(first["request"]["parent"], src.id.as_str(), "{first}");
        assert_eq!(first["request"]["parent_seq"], snap.sandbox_seq, "{first}");
    }
    // Apart from each other.
    d.sh_ok(&a.id, "echo a > /root/who").await;
    assert_eq!(
        d.sh_ok(&b.id, "cat /root/who 2>&1 || true").await,
        "cat: /root/who: No such file or directory\n"
    );

    // Deleted: gone from the API, the disk and the layer leases; its sandboxes keep working.
    assert!(crate::common::image_store()
        .join("leases")
        .join(format!("snapshot.{}.json", snap.id))
        .exists());
    c.delete_snapshot(&snap.id).await.unwrap();
    let e = c.get_snapshot(&snap.id).await.expect_err("deleted");
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    let e = c.create(&from).await.expect_err("deleted");
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    assert!(!d.state_dir.join("snapshots").join(&snap.id).exists());
    let lease = crate::common::image_store()
        .join("leases")
        .join(format!("snapshot.{}.json", snap.id));
    assert!(!lease.exists(), "{} left", lease.display());
    assert_eq!(d.sh_ok(&a.id, "cat /root/who").await, "a\n");
    for k in [&a, &b] {
        c.delete(&k.id).await.unwrap();
        assert_eq!(qemu_of(&k.id), None, "QEMU of {} still runs", k.id);
    }
}
