//! A container sandbox's mount table: few superblocks of its own (each one costs the kernel a
//! shrinker in every memory cgroup, see docs/density.md), with masks, /dev and /dev/shm that
//! still behave as before.

use std::collections::{BTreeMap, BTreeSet};

use warren_client::CreateSandboxRequest;

use crate::common::Daemon;

/// The superblocks a container sandbox owns with its writable layer on disk (the default):
/// the overlay, proc and the mqueue superblock of its IPC namespace. The writable layer is a
/// directory of the node's one writable-layer file system, `/dev` and the masks directories of
/// it; `/sys` is the node's one shared read-only sysfs; devpts comes with the first terminal
/// (or at start with `pty`).
const OWN_SUPERBLOCKS: usize = 3;
/// With its writable layer in memory, the tmpfs holding it too.
const OWN_SUPERBLOCKS_IN_MEMORY: usize = 4;

/// `major:minor` → file system type of every entry of a mountinfo text.
fn devices(mountinfo: &str) -> BTreeMap<String, String> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let dev = l.split_whitespace().nth(2)?;
            let fstype = l.split(" - ").nth(1)?.split_whitespace().next()?;
            Some((dev.to_string(), fstype.to_string()))
        })
        .collect()
}

#[test]
fn devices_of_a_mountinfo() {
    let text = "74 44 0:43 / / rw,nodev - overlay overlay rw,lowerdir=l0\n\
                77 76 0:6 /null /dev/null rw - devtmpfs devtmpfs rw\n\
                78 76 0:6 /zero /dev/zero rw - devtmpfs devtmpfs rw\n";
    let d = devices(text);
    assert_eq!(d.len(), 2);
    assert_eq!(d["0:43"], "overlay");
    assert_eq!(d["0:6"], "devtmpfs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_few_superblocks_of_its_own() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let on_disk = few_superblocks(&d, CreateSandboxRequest::default(), OWN_SUPERBLOCKS).await;
    assert!(
        !on_disk.values().any(|t| t == "tmpfs"),
        "a sandbox on disk owns a tmpfs: {on_disk:?}"
    );
    let in_memory = few_superblocks(
        &d,
        CreateSandboxRequest {
            disk_medium: Some(warren_types::DiskMedium::Memory),
            ..Default::default()
        },
        OWN_SUPERBLOCKS_IN_MEMORY,
    )
    .await;
    assert!(
        in_memory.values().any(|t| t == "tmpfs"),
        "a sandbox in memory has no tmpfs: {in_memory:?}"
    );
}

/// Checks a sandbox made by `req` owns at most `most` superblocks and shares none with a
/// second one; returns its own (device → type).
async fn few_superblocks(
    d: &Daemon,
    req: CreateSandboxRequest,
    most: usize,
) -> BTreeMap<String, String> {
    let id = d.create(&req).await.id;
    let inside = d.sh_ok(&id, "cat /proc/self/mountinfo").await;
    // /sys is the shared sysfs: read-only, and the same superblock in every sandbox.
    let sys: Vec<&str> = inside
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some("/sys"))
        .collect();
    assert_eq!(sys.len(), 1, "one mount at /sys: {inside}");
    assert!(sys[0].contains(" - sysfs "), "/sys is a sysfs: {}", sys[0]);
    let opts = sys[0].split_whitespace().nth(5).unwrap_or_default();
    assert!(
        opts.split(',').any(|o| o == "ro"),
        "/sys is read-only: {opts}"
    );
    // Devices also mounted in the host's table are shared (image layers, the host's /dev,
    // the node's sysfs).
    let host = devices(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let own: BTreeMap<String, String> = devices(&inside)
        .into_iter()
        .filter(|(dev, _)| !host.contains_key(dev))
        .collect();
    assert!(
        own.len() <= most,
        "the sandbox has {} superblocks of its own (at most {most}): {own:?}\n{inside}",
        own.len()
    );
    let types: BTreeSet<&str> = own.values().map(String::as_str).collect();
    assert_eq!(
        types.len(),
        own.len(),
        "one file system type mounted twice: {own:?}"
    );
    // A second sandbox shares none of them.
    let other = d.create(&req).await.id;
    let theirs = devices(&d.sh_ok(&other, "cat /proc/self/mountinfo").await);
    for dev in own.keys() {
        assert!(
            !theirs.contains_key(dev),
            "device {dev} is in two sandboxes"
        );
    }
    own
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_masks_are_empty_read_only_and_closed() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let masks = [
        "/proc/acpi",
        "/sys/firmware",
        "/sys/kernel/debug",
        "/sys/fs/cgroup",
    ];
    let present: Vec<&str> = {
        let mut v = Vec::new();
        for m in masks {
            if d.sh(&id, &format!("test -d {m}")).await.success() {
                v.push(m);
            }
        }
        v
    };
    assert!(!present.is_empty(), "no masked directory exists");
    // Something written where the sandbox can write (the same tmpfs) shows in no mask.
    d.sh_ok(
        &id,
        "echo x > /dev/shm/probe && mkdir /dev/shm/d && echo y > /tmp/probe",
    )
    .await;
    for m in &present {
        let listing = d.sh_ok(&id, &format!("ls -A {m}")).await;
        assert_eq!(listing.trim(), "", "{m} is not empty: {listing}");
        for (what, cmd) in [
            ("create a file", format!("touch {m}/x")),
            ("make a directory", format!("mkdir {m}/x")),
            ("chmod", format!("chmod 777 {m}")),
            ("remount rw", format!("mount -o remount,rw {m}")),
            ("unmount", format!("umount {m}")),
            ("mount over", format!("mount -t tmpfs none {m}")),
        ] {
            let r = d.sh(&id, &format!("{cmd} 2>&1")).await;
            assert!(!r.success(), "{what} in {m}: `{cmd}` succeeded: {r:?}");
        }
        // `..` of a mask is the directory it is mounted on, not the staging tmpfs.
        let up = d
            .sh_ok(&id, &format!("stat -c '%d %i' {m}/.. $(dirname {m})"))
            .await;
        let lines: Vec<&str> = up.lines().collect();
        assert_eq!(lines.len(), 2, "{up}");
        assert_eq!(lines[0], lines[1], "{m}/.. is not its parent: {up}");
    }
    let table = d.sh_ok(&id, "cat /proc/self/mountinfo").await;
    for m in &present {
        let line = table
            .lines()
            .find(|l| l.split_whitespace().nth(4) == Some(m))
            .unwrap_or_else(|| panic!("{m} is not a mount point:\n{table}"));
        let opts = line.split_whitespace().nth(5).unwrap();
        assert!(
            opts.split(',').any(|o| o == "ro"),
            "{m} is not read-only: {line}"
        );
    }
    // Nothing can be moved out of /dev (the staging tmpfs) into the root or back.
    let out = d
        .sh_ok(
            &id,
            "python3 -c '
import errno, os
res = []
for a, b in [(\"/dev/shm/d\", \"/d\"), (\"/dev/shm/d\", \"/proc/acpi/d\"), (\"/tmp/probe\", \"/dev/shm/p\")]:
    try:
        os.rename(a, b)
        res.append(\"moved\")
    except OSError as e:
        res.append(errno.errorcode[e.errno])
print(\" \".join(res))
'",
        )
        .await;
    assert_eq!(
        out.trim(),
        "EXDEV EXDEV EXDEV",
        "renames across mounts: {out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_dev_and_dev_shm_work() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d
        .create(&CreateSandboxRequest {
            disk_mb: Some(32),
            pty: true,
            ..Default::default()
        })
        .await
        .id;
    let out = d
        .sh_ok(
            &id,
            "stat -c %a /dev/shm; head -c 16 /dev/urandom | wc -c; head -c 8 /dev/zero | od -An -tx1 | tr -d ' \\n'; echo; \
             echo x > /dev/null && echo null-ok; (echo x > /dev/full) 2>/dev/null || echo full-refused; \
             test -c /dev/tty && echo tty-ok; test -L /dev/ptmx && test -c /dev/pts/ptmx && echo ptmx-ok",
        )
        .await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "1777",
            "16",
            "0000000000000000",
            "null-ok",
            "full-refused",
            "tty-ok",
            "ptmx-ok"
        ],
        "{out}"
    );
    // A PTY can be opened (devpts is the sandbox's own, mounted at start with `pty`).
    let pty = d
        .sh_ok(
            &id,
            "python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'",
        )
        .await;
    assert!(pty.trim().starts_with("/dev/pts/"), "{pty}");
    // /dev/shm: anyone writes, the sticky bit keeps others' files; no exec, no devices.
    let out = d
        .sh_ok(
            &id,
            "python3 -c '
import errno, os, stat
open(\"/dev/shm/root-file\", \"w\").write(\"r\")
res = []
pid = os.fork()
if pid == 0:
    os.setgid(65534); os.setuid(65534)
    try:
        open(\"/dev/shm/nobody-file\", \"w\").write(\"n\"); r = [\"write-ok\"]
    except OSError as e:
        r = [\"write-\" + errno.errorcode[e.errno]]
    try:
        os.unlink(\"/dev/shm/root-file\"); r.append(\"unlink-ok\")
    except OSError as e:
        r.append(\"unlink-\" + errno.errorcode[e.errno])
    print(\" \".join(r), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
'; cp /bin/true /dev/shm/t && chmod +x /dev/shm/t; /dev/shm/t 2>/dev/null && echo exec-ok || echo exec-refused; \
             grep ' /dev ' /proc/self/mountinfo | tr ' ' '\\n' | sed -n 6p",
        )
        .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"write-ok unlink-EPERM"), "{out}");
    assert_eq!(lines.get(1), Some(&"exec-refused"), "{out}");
    let opts = lines.get(2).copied().unwrap_or_default();
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(opts.split(',').any(|x| x == o), "/dev lacks {o}: {opts}");
    }
    // /dev/shm counts against the disk limit now: 64 MiB do not fit in a 32 MiB layer.
    let r = d
        .sh(
            &id,
            "dd if=/dev/zero of=/dev/shm/big bs=1M count=64 2>&1; rm -f /dev/shm/big",
        )
        .await;
    // (ENOSPC from a tmpfs in memory, EDQUOT from the quota of a layer on disk.)
    assert!(
        r.stdout.contains("No space left") || r.stdout.contains("quota exceeded"),
        "64 MiB fit into /dev/shm of a 32 MiB disk: {r:?}"
    );
}

/// Without `pty`, `/dev/pts` is empty until the first terminal call mounts the sandbox's own
/// devpts (from outside, into the sandbox's namespaces); then programs inside open PTYs too,
/// and a second sandbox's terminals are numbered on their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_devpts_comes_with_the_first_terminal() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let openpty =
        "python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))' 2>&1 || echo no-pty";
    let before = d.sh_ok(&id, openpty).await;
    assert!(
        before.contains("no-pty"),
        "a PTY before any terminal: {before}"
    );
    let own = d
        .sh_ok(&id, "grep -c ' - devpts ' /proc/self/mountinfo || true")
        .await;
    assert_eq!(own.trim(), "0", "devpts mounted before the first terminal");
    open_terminal(&d, &id).await;
    let after = d.sh_ok(&id, openpty).await;
    assert!(after.trim().starts_with("/dev/pts/"), "{after}");
    // A second terminal does not mount another devpts.
    open_terminal(&d, &id).await;
    let n = d
        .sh_ok(&id, "grep -c ' - devpts ' /proc/self/mountinfo")
        .await;
    assert_eq!(n.trim(), "1", "devpts mounts after two terminals");
    let opts = d
        .sh_ok(
            &id,
            "grep ' /dev/pts ' /proc/self/mountinfo | tr ' ' '\\n' | sed -n 6p",
        )
        .await;
    for o in ["nosuid", "noexec"] {
        assert!(
            opts.trim().split(',').any(|x| x == o),
            "/dev/pts lacks {o}: {opts}"
        );
    }
    // The devpts is the sandbox's own: another sandbox's first terminal mounts another.
    let other = d.sandbox().await;
    open_terminal(&d, &other).await;
    let pts = "grep ' /dev/pts ' /proc/self/mountinfo | cut -d' ' -f3";
    let (a, b) = (d.sh_ok(&id, pts).await, d.sh_ok(&other, pts).await);
    assert!(
        !a.trim().is_empty() && a != b,
        "two sandboxes share a devpts: {a} {b}"
    );
    let host = devices(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    assert!(
        !host.contains_key(a.trim()),
        "the host mounts the sandbox's devpts"
    );
}

/// A sandbox that turned its `/dev/pts` into a symbolic link before its first terminal gets
/// no devpts anywhere: the terminal call fails with an error, the sandbox keeps serving, and
/// nothing is mounted on the link's target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_devpts_never_follows_a_link() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    d.sh_ok(
        &id,
        "rmdir /dev/pts && mkdir -p /tmp/t && ln -s /tmp/t /dev/pts",
    )
    .await;
    let r = d.client().pty(&id, "/bin/sh", 80, 24).await;
    assert!(r.is_err(), "a terminal over a linked /dev/pts");
    let n = d
        .sh_ok(&id, "grep -c ' - devpts ' /proc/self/mountinfo || true")
        .await;
    assert_eq!(n.trim(), "0", "a devpts was mounted somewhere");
    assert_eq!(d.sh_ok(&id, "echo alive").await.trim(), "alive");
}

async fn open_terminal(d: &Daemon, id: &str) {
    let mut pty = d
        .client()
        .pty(id, "/bin/sh", 80, 24)
        .await
        .expect("opening a terminal");
    pty.send(&b"exit 0\n"[..]).await.unwrap();
    let (out, code, _) =
        crate::exec::read_until_exit(&mut pty, std::time::Duration::from_secs(20)).await;
    assert_eq!(code, Some(0), "terminal output: {out:?}");
}
