//! Fork of a microVM: children restored from one snapshot of the parent, each with its own
//! disk and memory, a fresh agent session and the parent's hostname; a write in one is not
//! seen in another or in the parent, no QEMU is given transparent huge pages, and nothing of
//! the fork is left behind.

use crate::memory::daemon_with_microvm;
use crate::qemu_of;
use warren_client::{CreateSandboxRequest, ForkRequest, Substrate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_fork_children_are_isolated_from_each_other_and_the_parent() {
    let Some(d) = daemon_with_microvm().await else {
        return;
    };
    let c = d.client();
    let parent = d
        .create(&CreateSandboxRequest {
            substrate: Substrate::Microvm,
            memory_mb: Some(256),
            hostname: Some("forked".into()),
            ..Default::default()
        })
        .await;
    let sum = d
        .sh_ok(
            &parent.id,
            "head -c 3000000 /dev/urandom > /root/data; echo p > /dev/shm/mem; sha256sum /root/data",
        )
        .await;
    let kids = c
        .fork(
            &parent.id,
            &ForkRequest {
                n: 3,
                labels: Default::default(),
            },
        )
        .await
        .expect("fork of a microVM");
    assert_eq!(kids.len(), 3);
    // No QEMU gets transparent huge pages: a child's RAM is filled from the snapshot, and with
    // them every first write into a 2 MiB range zeroed all of it and kept it resident.
    for k in kids.iter().map(|k| &k.id).chain([&parent.id]) {
        let pid = qemu_of(k).expect("QEMU of a sandbox");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(
            status.lines().any(|l| l == "THP_enabled:\t0"),
            "QEMU of {k} may be given huge pages:\n{status}"
        );
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(k.substrate, Substrate::Microvm);
        // The parent's files (disk) and memory (a tmpfs) as they were, then a write of its own.
        let got = d
            .sh_ok(
                &k.id,
                &format!(
                    "hostname; cat /dev/shm/mem; sha256sum /root/data; echo {i} > /root/who; echo {i} > /dev/shm/mem"
                ),
            )
            .await;
        assert_eq!(got, format!("forked\np\n{sum}"), "child {i}");
    }
    for (i, k) in kids.iter().enumerate() {
        assert_eq!(
            d.sh_ok(&k.id, "cat /root/who /dev/shm/mem").await,
            format!("{i}\n{i}\n"),
            "child {i} saw another's write"
        );
    }
    assert_eq!(
        d.sh_ok(&parent.id, "cat /root/who 2>&1; cat /dev/shm/mem")
            .await,
        "cat: /root/who: No such file or directory\np\n"
    );
    // The scratch snapshot is gone; deleting leaves no QEMU.
    let forks = d.state_dir.join("vm/forks");
    let left: Vec<_> = std::fs::read_dir(&forks)
        .map(|r| r.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "fork snapshots left: {left:?}");
    for k in kids.iter().map(|k| &k.id).chain([&parent.id]) {
        c.delete(k).await.unwrap();
        assert_eq!(qemu_of(k), None, "QEMU of {k} still runs");
    }
}
