//! A sandbox sees none of the host's processes, files or network, cannot read the host's
//! page tables, and its root is nobody outside.

use std::io::Write;
use std::time::Duration;

use crate::common::Daemon;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_host_processes_are_invisible() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let ps = d.ps(&id).await;
    let lines: Vec<&str> = ps.lines().collect();
    // The agent (PID 1), the shell running the listing and its `tr` children; nothing else.
    assert!(
        lines.len() <= 6,
        "the sandbox sees {} processes:\n{ps}",
        lines.len()
    );
    assert!(
        lines.iter().any(|l| l.starts_with("1 ")),
        "no PID 1 in the sandbox:\n{ps}"
    );
    for host_name in ["warrend", "systemd", "cargo", "nextest", "sshd"] {
        assert!(
            !ps.contains(host_name),
            "host process {host_name} is visible in the sandbox:\n{ps}"
        );
    }
    // Nor is the test process itself.
    let me = std::env::current_exe().unwrap();
    let me = me.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!ps.contains(&me), "the test process is visible:\n{ps}");
    // /proc holds as few processes as the listing showed.
    let count = d
        .sh_ok(&id, "ls /proc | grep -c '^[0-9][0-9]*$'")
        .await
        .trim()
        .parse::<usize>()
        .unwrap();
    assert!(count <= 6, "/proc has {count} process entries");
    // The host's pid of the daemon is not a process in here (the sandbox's pids are small).
    let host_pid = d.pid().unwrap();
    let r = d
        .sh(&id, &format!("grep -q warrend /proc/{host_pid}/cmdline"))
        .await;
    assert!(!r.success(), "host pid {host_pid} (warrend) is visible");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_host_files_are_invisible() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let secret = std::env::temp_dir().join(format!("warren-host-secret-{}", d.node));
    let mut f = std::fs::File::create(&secret).unwrap();
    writeln!(f, "host secret {}", d.node).unwrap();
    drop(f);
    let path = secret.display().to_string();
    let r = d.sh(&id, &format!("cat {path}")).await;
    std::fs::remove_file(&secret).unwrap();
    assert!(
        !r.success() && !r.stdout.contains("host secret"),
        "the host file {path} is readable in the sandbox: {r:?}"
    );
    // Nor is the daemon's state, the repository, or the host's root.
    for p in [
        d.dir.display().to_string(),
        crate::common::repo_root().display().to_string(),
        "/var/lib/warren".into(),
    ] {
        let r = d.sh(&id, &format!("test -e '{p}'")).await;
        assert_eq!(r.exit_code, Some(1), "{p} exists in the sandbox");
    }
    // The root is the image's: Debian bookworm.
    let os = d.sh_ok(&id, "cat /etc/os-release").await;
    assert!(os.contains("bookworm"), "unexpected /etc/os-release: {os}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_network_is_loopback_only() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let dev = d.sh_ok(&id, "cat /proc/net/dev").await;
    let ifaces: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "interfaces in the sandbox:\n{dev}");

    // A TCP port on the host's loopback is not reachable from the sandbox's loopback.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        "import socket\n\
         try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n\
         except OSError as e:\n    print('refused', e)\n"
    );
    let r = d
        .exec(
            &id,
            &warren_client::ExecRequest::argv(["python3", "-c", script.as_str()]),
        )
        .await;
    assert!(r.success(), "python failed: {r:?}");
    assert!(
        r.stdout.starts_with("refused"),
        "the sandbox reached the host's 127.0.0.1:{port}: {}",
        r.stdout
    );
    assert!(
        listener.accept().is_err(),
        "the host listener accepted a connection from the sandbox"
    );
    // No route anywhere else either: no interface but loopback (checked without sending
    // traffic to any address outside this machine).
    let r = d
        .sh(
            &id,
            "python3 -c \"import socket; print(sorted(n for _, n in socket.if_nameindex()))\"",
        )
        .await;
    assert_eq!(
        r.stdout.trim(),
        "['lo']",
        "the sandbox has more than loopback: {r:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_kpagecgroup_is_unreadable() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    for p in [
        "/proc/kpagecgroup",
        "/proc/kpageflags",
        "/proc/kpagecount",
        "/proc/kcore",
    ] {
        // Either the read fails or it yields nothing.
        let r = d
            .sh(&id, &format!("head -c 4096 {p} 2>/dev/null | wc -c"))
            .await;
        assert_eq!(
            r.stdout.trim(),
            "0",
            "{p} yields data in the sandbox: {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolation_root_cannot_write_outside() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    // Root inside is an unprivileged range outside.
    let map = d.sh_ok(&id, "cat /proc/self/uid_map").await;
    let fields: Vec<u64> = map.split_whitespace().map(|f| f.parse().unwrap()).collect();
    assert_eq!(fields.len(), 3, "uid_map has more than one line: {map}");
    assert_eq!(fields[0], 0, "uid_map: {map}");
    assert_ne!(fields[1], 0, "uid 0 inside is uid 0 outside: {map}");
    let gid_map = d.sh_ok(&id, "cat /proc/self/gid_map").await;
    let gid_outside = gid_map.split_whitespace().nth(1);
    assert!(
        gid_outside.is_some() && gid_outside != Some("0"),
        "gid 0 inside is gid 0 outside: {gid_map}"
    );
    assert_eq!(d.sh_ok(&id, "id -u").await.trim(), "0");

    // Seen from the host, no process of the sandbox runs as root.
    for pid in d.sandbox_pids(&id) {
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uids.split_whitespace().skip(1).all(|u| u != "0"),
            "sandbox process {pid} runs as host root: {uids}"
        );
    }

    for (what, cmd) in [
        ("sysrq trigger", "echo h > /proc/sysrq-trigger"),
        ("touch sysrq trigger", "touch /proc/sysrq-trigger"),
        ("kernel sysctl", "echo 1 > /proc/sys/kernel/panic"),
        ("mount tmpfs", "mount -t tmpfs none /mnt"),
        ("mount proc", "mount -t proc proc /mnt"),
        ("write /sys", "echo 1 > /sys/kernel/mm/ksm/run"),
        ("remount /sys rw", "mount -o remount,rw /sys"),
        ("mknod", "mknod /tmp/sda b 8 0"),
        ("load a module", "echo > /proc/sys/kernel/modprobe"),
        ("set the clock", "date -s '2001-01-01'"),
    ] {
        let r = d.sh(&id, &format!("{cmd} 2>&1")).await;
        assert!(
            !r.success(),
            "{what} (`{cmd}`) succeeded as root in the sandbox: {}",
            r.stdout
        );
    }
    // Renaming is allowed only in the sandbox's own UTS namespace; the host keeps its name.
    let host_before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let _ = d.sh(&id, &format!("hostname x{} 2>&1", d.node)).await;
    let host_after = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(host_before, host_after, "the sandbox renamed the host");

    // Still alive and well after the refusals.
    tokio::time::timeout(Duration::from_secs(10), d.sh_ok(&id, "true"))
        .await
        .expect("the sandbox stopped answering");
}
