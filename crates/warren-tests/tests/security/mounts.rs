//! Mount and namespace games: mount, the new mount API, unshare, setns, remounting /proc
//! read-write, pivot_root back to the host.

use crate::{Scene, SYSCALL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_unshare_and_setns_are_refused() {
    let Some(s) = Scene::new().await else { return };
    for (what, cmd) in [
        ("mount tmpfs", "mount -t tmpfs none /mnt"),
        ("bind the root", "mount --bind / /mnt"),
        ("new user namespace", "unshare -U true"),
        ("new user+mount namespace", "unshare -Urm true"),
        ("new network namespace", "unshare -n true"),
        (
            "enter PID 1's namespaces",
            "nsenter -t 1 -m -u -i -n -p true",
        ),
    ] {
        let r = s.sh(&format!("{cmd} 2>&1")).await;
        assert!(!r.success(), "{what}: `{cmd}` succeeded: {r:?}");
    }
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET = 0x10000000, 0x00020000, 0x40000000
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
print("unshare", call(272, CLONE_NEWUSER)[1], call(272, CLONE_NEWNS)[1],
      "setns", call(308, fd, 0)[1],
      # clone with namespace flags (SIGCHLD as the exit signal)
      "clone", call(56, CLONE_NEWUSER | 17, 0, 0, 0, 0)[1],
      "clone3", call(435, 0, 0)[1])
"#
        ))
        .await;
    assert_eq!(
        out.trim(),
        "unshare EPERM EPERM setns EPERM clone EPERM clone3 ENOSYS",
        "namespace syscalls: {out}"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_mount_api_is_refused() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
res = [
  ("fsopen", call(430, b"tmpfs", 0)),
  ("fspick", call(433, -100, b"/", 0)),
  ("open_tree", call(428, -100, b"/", 1)),          # OPEN_TREE_CLONE
  ("move_mount", call(429, -1, b"", -100, b"/mnt", 4)),
  ("fsmount", call(432, 3, 0, 0)),
  ("fsconfig", call(431, 3, 6, 0, 0, 0)),
  ("mount_setattr", call(442, -100, b"/proc", 0, 0, 0)),
  ("mount", call(165, b"none", b"/mnt", b"tmpfs", 0, 0)),
  ("umount2", call(166, b"/proc", 2)),
  ("pivot_root", call(155, b"/tmp", b"/tmp")),
]
print(" ".join(f"{n}={e}" for n, (_, e) in res))
"#
        ))
        .await;
    for name in [
        "fsopen",
        "fspick",
        "open_tree",
        "move_mount",
        "fsmount",
        "fsconfig",
        "mount_setattr",
        "mount",
        "umount2",
        "pivot_root",
    ] {
        assert!(
            out.split_whitespace().any(|w| w == format!("{name}=EPERM")),
            "{name} not refused: {out}"
        );
    }
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_cannot_be_remounted_or_unmasked() {
    let Some(s) = Scene::new().await else { return };
    for (what, cmd) in [
        ("remount /proc/sys rw", "mount -o remount,rw /proc/sys"),
        ("remount /proc rw", "mount -o remount,rw /proc"),
        ("unmount the /proc/sys overlay", "umount /proc/sys"),
        ("unmask kcore", "umount /proc/kcore"),
        ("unmask sysrq", "umount /proc/sysrq-trigger"),
        ("fresh procfs", "mount -t proc proc /mnt"),
        ("fresh sysfs", "mount -t sysfs sys /mnt"),
    ] {
        let r = s.sh(&format!("{cmd} 2>&1")).await;
        assert!(!r.success(), "{what}: `{cmd}` succeeded: {r:?}");
    }
    let r = s.sh("echo 1 > /proc/sys/kernel/panic 2>&1").await;
    assert!(!r.success(), "/proc/sys became writable");
    // Walking up from the root stays at the root (pivot_root detached the host's tree).
    let ino_root = s.sh_ok_stdout("stat -c %i /").await;
    let ino_up = s.sh_ok_stdout("cd /../../.. && stat -c %i .").await;
    assert_eq!(ino_root, ino_up, "`cd /..` left the sandbox root");
    let r = s
        .sh("test -e /.oldroot || test -e /run/warren-sandbox/root/etc")
        .await;
    assert!(!r.success(), "traces of the host's tree are reachable");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_inside_names_a_host_path() {
    let Some(s) = Scene::new().await else { return };
    let seen = s
        .sh_ok_stdout(
            "tr '\\0' ' ' < /proc/1/cmdline; echo; cat /proc/mounts /proc/self/mountinfo; \
             cat /proc/1/mountinfo /proc/1/mounts 2>/dev/null; true",
        )
        .await;
    let d = &s.d;
    let host = [
        crate::common::bin_dir(),
        crate::common::image_store(),
        crate::common::repo_root(),
        d.dir.clone(),
        d.state_dir.clone(),
        "/var/lib/warren".into(),
        "/run/warren".into(),
    ];
    for p in host {
        let p = p.display().to_string();
        assert!(
            !seen.contains(&p),
            "the sandbox sees the host path {p}:\n{seen}"
        );
    }
    // PID 1 is named, not located.
    assert!(seen.starts_with("warren-agent container"), "{seen}");
    s.assert_unaffected().await;
}
