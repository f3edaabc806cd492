//! Snapshots of containers: the files as they were (deletions too), fresh processes, the
//! source's settings; a function sandbox cannot be snapshotted; a deleted snapshot takes its
//! packed layer with it once no sandbox uses it.

use crate::common::{image_store, Daemon};
use warren_client::{CreateSandboxRequest, CreateSnapshotRequest, ErrorCode, Substrate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_snapshot_keeps_files_and_settings_not_processes() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let c = d.client();
    let src = d
        .create(&CreateSandboxRequest {
            memory_mb: Some(256),
            env: [("WHO".to_string(), "src".to_string())].into(),
            workdir: Some("/root".into()),
            ..Default::default()
        })
        .await;
    d.sh_ok(
        &src.id,
        "echo kept > /root/f; mkdir -p /root/d/e; rm -f /etc/motd; sleep 1000 >/dev/null 2>&1 &",
    )
    .await;
    let snap = c
        .snapshot(&src.id, &CreateSnapshotRequest::default())
        .await
        .expect("snapshot of a container");
    assert_eq!(
        (snap.substrate, snap.processes),
        (Substrate::Container, false)
    );
    assert!(snap.size_bytes > 0);
    // The source goes on, and its later writes are not in the snapshot.
    d.sh_ok(&src.id, "echo later > /root/g").await;

    let made = d
        .create(&CreateSandboxRequest {
            snapshot: Some(snap.id.clone()),
            env: [("MORE".to_string(), "1".to_string())].into(),
            ..Default::default()
        })
        .await;
    assert_eq!(made.limits.memory_mb, 256);
    let got = d
        .sh_ok(
            &made.id,
            "pwd; echo $WHO $MORE; cat f; ls -d d/e; ls g /etc/motd 2>&1 | sort; \
             cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep || true",
        )
        .await;
    assert_eq!(
        got,
        "/root\nsrc 1\nkept\nd/e\n\
         ls: cannot access '/etc/motd': No such file or directory\n\
         ls: cannot access 'g': No such file or directory\n0\n"
    );
    let first = serde_json::to_value(&c.trajectory(&made.id, None).await.unwrap()[0]).unwrap();
    assert_eq!(
        (first["kind"].as_str(), first["request"]["parent"].as_str()),
        (Some("forked_from"), Some(src.id.as_str()))
    );

    // Function sandboxes hold no state worth a snapshot: refused, nothing kept.
    let f = d
        .create(&CreateSandboxRequest {
            substrate: Substrate::Function,
            ..Default::default()
        })
        .await;
    let e = c
        .snapshot(&f.id, &CreateSnapshotRequest::default())
        .await
        .err();
    // A node may serve function sandboxes as containers (then it may snapshot them).
    if let Some(e) = e {
        assert_eq!(e.code(), Some(ErrorCode::InvalidState), "{e}");
    }

    // Deleted: the lease goes; the sandbox made from it keeps its files.
    let lease = image_store()
        .join("leases")
        .join(format!("snapshot.{}.json", snap.id));
    assert!(lease.exists());
    c.delete_snapshot(&snap.id).await.unwrap();
    assert!(!lease.exists());
    assert!(!d.state_dir.join("snapshots").join(&snap.id).exists());
    assert_eq!(d.sh_ok(&made.id, "cat /root/f").await, "kept\n");
    let e = c.delete_snapshot(&snap.id).await.expect_err("gone");
    assert_eq!(e.code(), Some(ErrorCode::NotFound));
    for s in c.snapshots().await.unwrap() {
        c.delete_snapshot(&s.id).await.unwrap();
    }
    for id in [&src.id, &made.id, &f.id] {
        c.delete(id).await.unwrap();
    }
}
