//! Device nodes: only a minimal /dev exists, no device node can be made, and the dangerous
//! filesystem and terminal ioctls are refused.

use crate::{Scene, SYSCALL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_is_minimal_and_raw_devices_are_absent() {
    let Some(s) = Scene::new().await else { return };
    let listing = s.sh_ok_stdout("ls -A /dev | sort | tr '\\n' ' '").await;
    let allowed = [
        "fd", "full", "mqueue", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
        "stdout", "tty", "urandom", "zero",
    ];
    for name in listing.split_whitespace() {
        assert!(
            allowed.contains(&name),
            "/dev/{name} exists in the sandbox: {listing}"
        );
    }
    for dev in [
        "/dev/mem",
        "/dev/kmem",
        "/dev/port",
        "/dev/sda",
        "/dev/vda",
        "/dev/nvme0n1",
        "/dev/kvm",
        "/dev/fuse",
    ] {
        let r = s.sh(&format!("test -e {dev}")).await;
        assert_eq!(r.exit_code, Some(1), "{dev} exists in the sandbox");
    }
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mknod_of_devices_is_refused() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .py(r#"
import os, stat, errno
res = []
for name, mode, dev in [("mem", stat.S_IFCHR, os.makedev(1, 1)),
                        ("sda", stat.S_IFBLK, os.makedev(8, 0)),
                        ("kvm", stat.S_IFCHR, os.makedev(10, 232))]:
    try:
        os.mknod("/tmp/" + name, mode | 0o600, dev)
        res.append(name + ":made")
    except OSError as e:
        res.append(name + ":" + errno.errorcode[e.errno])
# A fifo is an ordinary file type and stays allowed.
os.mkfifo("/tmp/fifo")
res.append("fifo:ok")
print(" ".join(res))
"#)
        .await;
    for dev in ["mem", "sda", "kvm"] {
        assert!(
            out.contains(&format!("{dev}:EACCES")) || out.contains(&format!("{dev}:EPERM")),
            "mknod {dev} was not refused: {out}"
        );
    }
    assert!(out.contains("fifo:ok"), "{out}");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filesystem_and_terminal_ioctls_are_refused() {
    // The attacker opens PTYs itself: its /dev/pts is mounted at start.
    let req = warren_client::CreateSandboxRequest {
        pty: true,
        ..Default::default()
    };
    let Some(s) = Scene::with(req).await else {
        return;
    };
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
import fcntl, pty, struct
a = os.open("/tmp/a", os.O_RDWR | os.O_CREAT, 0o600); os.write(a, b"x" * 4096)
b = os.open("/tmp/b", os.O_RDWR | os.O_CREAT, 0o600)
res = {}
def ioc(name, fd, req, arg=0):
    r, e = call(16, fd, req, arg)   # SYS_ioctl
    res[name] = e
ioc("FICLONE", b, 0x40049409, a)
ioc("FICLONE_HIGHBITS", b, 0x7fff000040049409, a)
ioc("FICLONERANGE", b, 0x4020940d, 0)
ioc("FIDEDUPERANGE", a, 0xc0189436, 0)
ioc("EXT4_IOC_MOVE_EXT", a, 0xc028660f, 0)
ioc("XFS_IOC_SWAPEXT", a, 0xc0c0586d, 0)
m, sl = pty.openpty()
ioc("TIOCSTI", sl, 0x5412, ctypes.addressof(ctypes.c_char(b"x")))
ioc("TIOCLINUX", sl, 0x541c, 0)
ioc("TIOCSETD", sl, 0x5423, 0)
# An ordinary terminal ioctl still works.
ioc("TIOCGWINSZ", sl, 0x5413, ctypes.addressof(ctypes.create_string_buffer(8)))
print(" ".join(f"{k}={v}" for k, v in res.items()))
"#
        ))
        .await;
    for name in [
        "FICLONE",
        "FICLONE_HIGHBITS",
        "FICLONERANGE",
        "FIDEDUPERANGE",
        "EXT4_IOC_MOVE_EXT",
        "XFS_IOC_SWAPEXT",
        "TIOCSTI",
        "TIOCLINUX",
        "TIOCSETD",
    ] {
        assert!(
            out.contains(&format!("{name}=EPERM ")),
            "{name} not refused: {out}"
        );
    }
    assert!(
        out.contains("TIOCGWINSZ=OK"),
        "an ordinary ioctl failed: {out}"
    );
    s.assert_unaffected().await;
}
