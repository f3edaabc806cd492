//! Each container sandbox has a host uid/gid range of its own: a process running as one
//! sandbox's ids (as an escaped process would) owns nothing of another's, neither its files
//! nor its processes.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use crate::common::{image_store, Daemon};

/// Where a sandbox's writable layer's files are on the host (`container/writable.rs`).
fn upper(id: &str) -> PathBuf {
    image_store()
        .join("mnt")
        .join("writable")
        .join(id)
        .join("upper")
}

/// Runs `sh -c script` on the host as uid and gid `id` (no supplementary groups); whether it
/// exited 0.
fn as_host_id(id: u32, script: &str) -> bool {
    Command::new("sh")
        .args(["-c", script])
        .uid(id)
        .gid(id)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running sh")
        .success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_one_sandbox_range_owns_nothing_of_another() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let a = d.sandbox().await;
    let b = d.sandbox().await;
    for id in [&a, &b] {
        d.sh_ok(id, "echo secret > /root/s && chmod 600 /root/s")
            .await;
    }
    let owner = |id: &str| {
        let m = std::fs::metadata(upper(id).join("root/s")).unwrap();
        (m.uid(), m.gid())
    };
    let (ua, ga) = owner(&a);
    let (ub, gb) = owner(&b);
    assert_eq!((ua, ub), (ga, gb), "uid and gid ranges differ");
    assert!(
        ua.abs_diff(ub) >= 65_536 && ga.abs_diff(gb) >= 65_536,
        "two sandboxes share host ids: {ua}:{ga} and {ub}:{gb}"
    );
    // Inside, both are root's files as before.
    assert_eq!(d.sh_ok(&a, "stat -c %u:%g /root/s").await.trim(), "0:0");
    // As sandbox a's root on the host: its own file is readable, b's is not.
    let a_file = upper(&a).join("root/s");
    let b_file = upper(&b).join("root/s");
    assert!(
        as_host_id(ua, &format!("cat {}", a_file.display())),
        "a's root cannot read its own file"
    );
    assert!(
        !as_host_id(ua, &format!("cat {}", b_file.display())),
        "a's root read b's file"
    );
    assert!(
        !as_host_id(ua, &format!("touch {}/x", upper(&b).display())),
        "a's root wrote into b's layer"
    );
    // Processes: a's ids may signal a's agent, not b's.
    let a_pid = d.sandbox_pids(&a)[0];
    let b_pid = d.sandbox_pids(&b)[0];
    assert!(
        as_host_id(ua, &format!("kill -0 {a_pid}")),
        "a's root cannot signal a's own agent"
    );
    assert!(
        !as_host_id(ua, &format!("kill -0 {b_pid}")),
        "a's root may signal b's agent"
    );
    // A deleted sandbox's files go with its layer.
    d.client().delete(&b).await.unwrap();
    assert!(!upper(&b).exists());
}

/// The host uid of a sandbox's root: the owner of its writable layer's directory.
fn range_of(id: &str) -> u32 {
    std::fs::metadata(upper(id).parent().unwrap())
        .unwrap()
        .uid()
}

/// Whether a create failed because the node's id ranges are all in use.
fn out_of_ranges(r: &Result<warren_types::SandboxInfo, warren_client::ClientError>) -> bool {
    matches!(r, Err(warren_client::ClientError::Api { error, .. })
        if error.message.contains("host id ranges"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_ranges_are_recycled_and_readopted_after_a_restart() {
    // A pool of two ranges.
    let Some(mut d) = Daemon::start_with(|_| vec!["--id-ranges".into(), "2".into()]).await else {
        return;
    };
    let req = warren_client::CreateSandboxRequest::default();
    let a = d.create(&req).await.id;
    let b = d.create(&req).await.id;
    let (ra, rb) = (range_of(&a), range_of(&b));
    assert_ne!(ra, rb, "two sandboxes with one range");
    let third = d.client().create(&req).await;
    assert!(
        out_of_ranges(&third),
        "a third sandbox from a pool of two: {third:?}"
    );
    // A deleted sandbox gives its range back.
    d.client().delete(&b).await.unwrap();
    let c = d.create(&req).await.id;
    assert_eq!(range_of(&c), rb, "the freed range was not handed out again");
    // A restarted node takes both ranges back from the records before any create.
    d.sh_ok(&a, "echo kept > /root/f").await;
    d.restart().await;
    let after = d.client().create(&req).await;
    assert!(
        out_of_ranges(&after),
        "a restarted node handed out a range two live sandboxes hold: {after:?}"
    );
    assert_eq!(range_of(&a), ra);
    assert_eq!(
        d.sh_ok(&a, "cat /root/f; stat -c %u /root/f")
            .await
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["kept", "0"]
    );
    // And a sandbox deleted after the restart frees its range too.
    d.client().delete(&a).await.unwrap();
    let e = d.create(&req).await.id;
    assert_eq!(range_of(&e), ra);
    for id in [&c, &e] {
        d.client().delete(id).await.unwrap();
    }
}
