//! Forged calls to the agent: its control channel, its memory, environment and fds, and
//! signals to PID 1.

use std::time::Duration;

use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_memory_environment_and_fds_are_unreachable() {
    let Some(s) = Scene::new().await else { return };
    for (what, cmd) in [
        (
            "write its memory",
            "printf x | dd of=/proc/1/mem bs=1 seek=4194304 conv=notrunc",
        ),
        (
            "read its memory",
            "dd if=/proc/1/mem bs=1 count=1 skip=4194304",
        ),
        ("read its environment", "cat /proc/1/environ"),
        ("list its fds", "ls /proc/1/fd"),
        ("open its control socket", "cat /proc/1/fd/3"),
        ("read its mappings", "cat /proc/1/maps"),
        ("enter its root", "ls /proc/1/root/"),
        ("read its stack", "cat /proc/1/stack"),
    ] {
        let r = s.sh(&format!("{cmd} 2>&1")).await;
        assert!(!r.success(), "{what}: `{cmd}` succeeded: {}", r.stdout);
        assert!(
            r.stdout.contains("Permission denied") || r.stdout.contains("Operation not permitted"),
            "{what}: unexpected answer: {}",
            r.stdout
        );
    }
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_channel_has_no_name_to_connect_to() {
    let Some(s) = Scene::new().await else { return };
    // No unix socket of the daemon or the agent is listed in the sandbox's namespace.
    let unix = s.sh_ok_stdout("cat /proc/net/unix").await;
    assert!(
        !unix.contains("warren"),
        "a warren socket is visible in the sandbox:\n{unix}"
    );
    // The daemon's socket path does not exist inside, and abstract names lead nowhere.
    let socket = s.d.socket.display().to_string();
    let out = s
        .py(&format!(
            r#"
import socket, errno
res = []
for addr in ["{socket}", "/run/warren/warren.sock", "\0warren", "\0warren-agent"]:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        c.connect(addr); res.append("connected")
    except OSError as e:
        res.append(errno.errorcode[e.errno])
print(" ".join(res))
"#
        ))
        .await;
    assert!(!out.contains("connected"), "a connection succeeded: {out}");
    // Commands do not inherit the agent's control fd or any other fd beyond 0-2.
    let fds = s
        .sh_ok_stdout("ls /proc/self/fd | sort -n | tr '\\n' ' '")
        .await;
    assert_eq!(
        fds.trim(),
        "0 1 2 3",
        "fds seen by a command (3 is ls's own dir): {fds}"
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_to_pid1_do_not_stop_the_agent() {
    let Some(s) = Scene::new().await else { return };
    let host_pid_before = s.d.sandbox_pids(&s.a);
    for sig in ["KILL", "TERM", "STOP", "INT", "HUP", "USR1", "SEGV", "ABRT"] {
        let _ = s.sh(&format!("kill -{sig} 1; true")).await;
    }
    // Kill everything visible (the shell included): PID 1 survives.
    let _ = s.sh("kill -9 -1").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = s.sh("echo alive; cat /proc/1/status | grep State").await;
    assert!(
        r.success() && r.stdout.contains("alive"),
        "the agent stopped answering: {r:?}"
    );
    assert!(
        !r.stdout.contains("stopped"),
        "PID 1 is stopped: {}",
        r.stdout
    );
    let host_pid_after = s.d.sandbox_pids(&s.a);
    assert!(
        host_pid_before.iter().any(|p| host_pid_after.contains(p)),
        "the agent was replaced: {host_pid_before:?} -> {host_pid_after:?}"
    );
    s.assert_unaffected().await;
}
