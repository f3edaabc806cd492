//! Nothing of one call is visible to the next one in the same warm container: files
//! (writable layer, /tmp, /dev/shm), processes (daemonized ones too), environment, SysV IPC,
//! and listening sockets.

use crate::common::Daemon;
use crate::{call, sh, sh_ok};

/// The network namespace of the container a call ran in: it identifies the container.
const NETNS: &str = "readlink /proc/self/ns/net";

const LEAVE_TRACES: &str = r#"
set -e
echo secret > /tmp/t; echo secret > /dev/shm/s; echo secret > /root/r; echo secret >> /etc/hosts
mkdir -p /work && echo secret > /work/w
setsid sleep 1000 < /dev/null > /dev/null 2>&1 &
( ( sleep 1000 < /dev/null > /dev/null 2>&1 & ) & )
nohup sh -c 'exec -a lingering sleep 1000' < /dev/null > /dev/null 2>&1 &
python3 - <<'PY' &
import os, socket, time
if os.fork():
    os._exit(0)
os.setsid()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 7777)); s.listen(8)
open("/tmp/listening", "w").close()
time.sleep(1000)
PY
for i in $(seq 100); do [ -e /tmp/listening ] && break; sleep 0.05; done
python3 -c 'import socket; socket.create_connection(("127.0.0.1", 7777), 1); print("listening")'
echo "$FROM_CALL_ONE"
"#;

const LOOK_FOR_TRACES: &str = r#"
for f in /tmp/t /dev/shm/s /root/r /work/w /tmp/listening; do [ -e "$f" ] && echo "file $f"; done
grep -q secret /etc/hosts && echo "file /etc/hosts"
for p in /proc/[0-9]*; do c=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null); case "$c" in "sleep 1000"*|lingering*|"python3 - "*) echo "proc $c";; esac; done
echo "procs $(ls -d /proc/[0-9]* | wc -l)"
[ -n "$FROM_CALL_ONE" ] && echo "env $FROM_CALL_ONE"
awk 'NR>1 && $4=="0A" {print "listen " $2}' /proc/net/tcp /proc/net/tcp6
python3 -c 'import socket; socket.create_connection(("127.0.0.1", 7777), 1); print("connect ok")' 2>/dev/null
cat /proc/sysvipc/shm | awk 'NR>1 {print "shm " $0}'
true
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_a_call_is_visible_to_the_next() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut first = sh(&format!(
        "{LEAVE_TRACES}\n{NETNS}; ipcmk -M 4096 >/dev/null 2>&1; true"
    ));
    first.env.insert("FROM_CALL_ONE".into(), "one".into());
    let r = call(&d, &first).await;
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert!(r.stdout.contains("listening\none\n"), "{r:?}");
    let netns = r.stdout.lines().last().unwrap().to_string();

    // Later calls until one lands in the same warm container (the pool rotates its
    // containers): it must see none of the first call's traces.
    let mut same = 0;
    for _ in 0..12 {
        let out = sh_ok(&d, &format!("{NETNS}\n{LOOK_FOR_TRACES}")).await;
        let mut lines = out.lines();
        let ns = lines.next().unwrap_or_default();
        let rest: Vec<&str> = lines.collect();
        assert!(
            !rest.iter().any(|l| l.starts_with("file")
                || l.starts_with("proc ")
                || l.starts_with("env")
                || l.starts_with("listen")
                || l.starts_with("connect")
                || l.starts_with("shm")),
            "a later call saw traces of an earlier one: {rest:?}"
        );
        // The call's own shell, the scripts' children, and nothing else.
        let procs: usize = rest
            .iter()
            .find_map(|l| l.strip_prefix("procs "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(999);
        assert!(procs <= 5, "{procs} processes visible: {rest:?}");
        if ns == netns {
            same += 1;
        }
    }
    assert!(same >= 2, "no later call ran in the first call's container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_runs_as_pid_1s_child_in_its_own_namespaces() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    // Its own pid namespace (the call's shell is pid 2 under the environment's init), its
    // own mount and uts namespaces, a root of the image, no capabilities to make more.
    let out = sh_ok(
        &d,
        "echo $$; readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/ipc; hostname; \
         cat /etc/os-release | head -1; unshare -U true 2>/dev/null && echo unshared; \
         mount -t tmpfs x /mnt 2>/dev/null && echo mounted; true",
    )
    .await;
    let again = sh_ok(
        &d,
        "readlink /proc/self/ns/pid /proc/self/ns/mnt /proc/self/ns/ipc",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "2", "{out}");
    assert!(
        !out.contains("unshared") && !out.contains("mounted"),
        "{out}"
    );
    // Namespaces are new for every call.
    let ns: Vec<&str> = lines[1..4].to_vec();
    let ns2: Vec<&str> = again.lines().collect();
    for (a, b) in ns.iter().zip(ns2.iter()) {
        assert_ne!(a, b, "a namespace was reused: {out} / {again}");
    }
    assert_eq!(lines[4], "function");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_in_and_come_back() {
    use warren_client::{CallFile, OutputEncoding};
    let Some(d) = Daemon::start().await else {
        return;
    };
    let mut r = sh("cat /w/in.txt | tr a-z A-Z > /w/out.txt; chmod 600 /w/out.txt; ls -l /w/run.sh | cut -c1-10; /w/run.sh");
    r.files = vec![
        CallFile {
            path: "/w/in.txt".into(),
            content: "hello".into(),
            ..Default::default()
        },
        CallFile {
            path: "/w/run.sh".into(),
            content: "IyEvYmluL3NoCmVjaG8gcmFu".into(), // "#!/bin/sh\necho ran"
            encoding: OutputEncoding::Base64,
            mode: Some(0o755),
        },
    ];
    r.return_files = vec!["/w/out.txt".into(), "/w/missing".into()];
    r.stdin = Some("ignored".into());
    let out = call(&d, &r).await;
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    assert_eq!(out.stdout, "-rwxr-xr-x\nran\n");
    assert_eq!(out.files.len(), 2);
    assert_eq!(out.files[0].content, "HELLO");
    assert_eq!(out.files[0].size, 5);
    assert_eq!(out.files[1].error.as_deref(), Some("not found"));
    // Stdin reaches the command.
    let mut r = sh("wc -c");
    r.stdin = Some("12345".into());
    assert_eq!(call(&d, &r).await.stdout.trim(), "5");
}

/// A call's `/etc/hostname`, `/etc/hosts` and `/etc/resolv.conf` are the container's, as in a
/// sandbox: its hostname, localhost, no network. They come from a layer the container's
/// agent wrote once; a call may change its own copies (the test above checks that the next
/// call does not see the change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_sees_its_hostname_hosts_and_resolver_files() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    for _ in 0..3 {
        let out = sh_ok(
            &d,
            "h=$(hostname); cat /etc/hostname; grep -c \"^127.0.1.1\t$h$\" /etc/hosts; \
             grep -c '^127.0.0.1\tlocalhost$' /etc/hosts; cat /etc/resolv.conf; \
             echo extra >> /etc/hostname && tail -n1 /etc/hostname; ls /etc/passwd",
        )
        .await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "function",
                "1",
                "1",
                "# no network by default",
                "extra",
                "/etc/passwd"
            ],
            "{out}"
        );
    }
}
