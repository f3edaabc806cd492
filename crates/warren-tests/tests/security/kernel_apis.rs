//! Kernel-facing syscalls an agent never needs: keyring, bpf, perf, userfaultfd, io_uring,
//! kexec, modules, swap, reboot, accounting, clocks, the kernel log; personality flags;
//! ptrace policy.

use crate::{Scene, SYSCALL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_facing_syscalls_are_refused() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
ts = ctypes.create_string_buffer(16)
res = [
  ("keyctl", call(250, 0, 0, 0, 0, 0)),
  ("add_key", call(248, b"user", b"k", b"v", 1, -2)),
  ("request_key", call(249, b"user", b"k", 0, 0)),
  ("bpf", call(321, 0, 0, 0)),
  ("perf_event_open", call(298, 0, 0, -1, -1, 0)),
  ("userfaultfd", call(323, 0)),
  ("kexec_load", call(246, 0, 0, 0, 0)),
  ("kexec_file_load", call(320, -1, -1, 0, 0, 0)),
  ("init_module", call(175, 0, 0, b"")),
  ("finit_module", call(313, 0, b"", 0)),
  ("delete_module", call(176, b"x", 0)),
  ("swapon", call(167, b"/tmp/swap", 0)),
  ("swapoff", call(168, b"/tmp/swap")),
  ("reboot", call(169, 0xfee1dead, 672274793, 0x4321fedc, 0)),
  ("acct", call(163, b"/tmp/acct")),
  ("settimeofday", call(164, ts, 0)),
  ("clock_settime", call(227, 0, ts)),
  ("adjtimex", call(159, ctypes.create_string_buffer(256))),
  ("syslog", call(103, 3, ctypes.create_string_buffer(64), 64)),
  ("open_by_handle_at", call(304, -100, ctypes.create_string_buffer(64), 0)),
  ("name_to_handle_at", call(303, -100, b"/", ctypes.create_string_buffer(64), ctypes.create_string_buffer(4), 0)),
  ("iopl", call(172, 3)),
  ("ioperm", call(173, 0, 1024, 1)),
  ("quotactl", call(179, 0, b"/", 0, 0)),
  ("io_uring_setup", call(425, 8, ctypes.create_string_buffer(120))),
]
print(" ".join(f"{n}={e}" for n, (_, e) in res))
"#
        ))
        .await;
    let words: Vec<&str> = out.split_whitespace().collect();
    for name in [
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "swapon",
        "swapoff",
        "reboot",
        "acct",
        "settimeofday",
        "clock_settime",
        "adjtimex",
        "syslog",
        "open_by_handle_at",
        "name_to_handle_at",
        "iopl",
        "ioperm",
        "quotactl",
    ] {
        assert!(
            words.contains(&format!("{name}=EPERM").as_str()),
            "{name} not refused: {out}"
        );
    }
    // io_uring looks missing, so runtimes fall back to ordinary I/O.
    assert!(words.contains(&"io_uring_setup=ENOSYS"), "io_uring: {out}");
    // The host clock was not moved.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now > 1_700_000_000, "the host clock moved");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn personality_is_limited_to_harmless_flags() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
print("query", call(135, 0xffffffff)[1],
      "linux32", call(135, 0x0008)[1],
      "linux", call(135, 0)[1],
      "read_implies_exec", call(135, 0x0400000)[1],
      "mmap_page_zero", call(135, 0x0100000)[1],
      "short_inode", call(135, 0x1000000)[1])
"#
        ))
        .await;
    assert_eq!(
        out.trim(),
        "query OK linux32 OK linux OK read_implies_exec EPERM mmap_page_zero EPERM short_inode EPERM",
        "{out}"
    );
    // Debuggers may still turn address randomisation off for their own children.
    let r = s.sh("setarch -R true").await;
    assert!(r.success(), "setarch -R failed: {r:?}");
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ptrace_reaches_own_processes_but_not_the_agent() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .py(&format!(
            "{SYSCALL}\n{}",
            r#"
import subprocess, time
PTRACE_ATTACH, PTRACE_DETACH = 16, 17
agent = call(101, PTRACE_ATTACH, 1, 0, 0)[1]
p = subprocess.Popen(["sleep", "30"])
time.sleep(0.1)
own = call(101, PTRACE_ATTACH, p.pid, 0, 0)[1]
os.waitpid(p.pid, 0x40000000)   # __WALL: the stop that the attach caused
call(101, PTRACE_DETACH, p.pid, 0, 0)
p.kill()
print("agent", agent, "own", own)
"#
        ))
        .await;
    assert_eq!(out.trim(), "agent EPERM own OK", "{out}");
    s.assert_unaffected().await;
}

/// A function call is held to exactly the sandbox's syscall policy, although its agent holds
/// only the builder half of it and each call environment adds the rest (see
/// `warren_sys::seccomp::CellFilters`): the same probes answer the same in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_calls_meet_the_same_syscall_policy() {
    let Some(s) = Scene::new().await else { return };
    let probe = format!(
        "{SYSCALL}\n{}",
        r#"
SIGCHLD = 17
res = [
  ("keyctl", call(250, 0, 0, 0, 0, 0)),
  ("bpf", call(321, 0, 0, 0)),
  ("mount", call(165, b"none", b"/mnt", b"tmpfs", 0, 0)),
  ("umount2", call(166, b"/proc", 2)),
  ("pivot_root", call(155, b"/tmp", b"/tmp")),
  ("sethostname", call(170, b"evil", 4)),
  ("unshare", call(272, 0x20000)),
  ("setns", call(308, 0, 0)),
  ("fsopen", call(430, b"tmpfs", 0)),
  ("clone_newns", call(56, 0x20000 | SIGCHLD, 0, 0, 0, 0)),
  ("clone_newpid", call(56, 0x20000000 | SIGCHLD, 0, 0, 0, 0)),
  ("clone_newuts", call(56, 0x04000000 | SIGCHLD, 0, 0, 0, 0)),
  ("clone_newipc", call(56, 0x08000000 | SIGCHLD, 0, 0, 0, 0)),
  ("clone_newuser", call(56, 0x10000000 | SIGCHLD, 0, 0, 0, 0)),
  ("clone3", call(435, 0, 0)),
  ("io_uring_setup", call(425, 8, ctypes.create_string_buffer(120))),
]
print(" ".join(f"{n}={e}" for n, (_, e) in res))
"#
    );
    let in_sandbox = s.py(&probe).await;
    // Started by the call's environment, and forked by the pool's Python zygote.
    for interpreter in [None, Some("python3")] {
        let mut req = warren_client::CallRequest::argv(["python3", "-c", probe.as_str()]);
        req.timeout_secs = Some(30.0);
        req.interpreter = interpreter.map(String::from);
        let r = s.d.client().call(&req).await.expect("call");
        assert_eq!(r.exit_code, Some(0), "{r:?}");
        assert_eq!(
            r.stdout, in_sandbox,
            "a call ({interpreter:?}) and a sandbox answer differently"
        );
    }
    let words: Vec<&str> = in_sandbox.split_whitespace().collect();
    for name in [
        "keyctl",
        "bpf",
        "mount",
        "umount2",
        "pivot_root",
        "sethostname",
        "unshare",
        "setns",
        "fsopen",
        "clone_newns",
        "clone_newpid",
        "clone_newuts",
        "clone_newipc",
        "clone_newuser",
    ] {
        assert!(
            words.contains(&format!("{name}=EPERM").as_str()),
            "{name} not refused: {in_sandbox}"
        );
    }
    for name in ["clone3", "io_uring_setup"] {
        assert!(
            words.contains(&format!("{name}=ENOSYS").as_str()),
            "{name}: {in_sandbox}"
        );
    }
    s.assert_unaffected().await;
}
