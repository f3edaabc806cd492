//! procfs and sysfs kernel interfaces: writes are refused, dangerous reads yield nothing, and
//! kernel addresses are hidden.

use crate::Scene;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procfs_kernel_writes_are_refused() {
    let Some(s) = Scene::new().await else { return };
    let panic_before = std::fs::read_to_string("/proc/sys/kernel/panic").unwrap();
    let caches_before = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
    for (what, cmd) in [
        (
            "sysrq trigger (crash the host)",
            "echo c > /proc/sysrq-trigger",
        ),
        ("kernel.panic", "echo 1 > /proc/sys/kernel/panic"),
        (
            "vm.overcommit_memory",
            "echo 2 > /proc/sys/vm/overcommit_memory",
        ),
        ("drop caches", "echo 3 > /proc/sys/vm/drop_caches"),
        (
            "core pattern (host code execution)",
            "echo '|/tmp/x' > /proc/sys/kernel/core_pattern",
        ),
        (
            "module loader path",
            "echo /tmp/x > /proc/sys/kernel/modprobe",
        ),
        (
            "hung task panic",
            "echo 1 > /proc/sys/kernel/hung_task_panic",
        ),
    ] {
        let r = s.sh(&format!("( {cmd} ) 2>&1")).await;
        assert!(!r.success(), "{what}: `{cmd}` succeeded: {r:?}");
        assert!(
            r.stdout.contains("Read-only file system")
                || r.stdout.contains("Permission denied")
                || r.stdout.contains("No such file")
                || r.stdout.contains("nonexistent"),
            "{what}: unexpected refusal: {}",
            r.stdout
        );
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/panic").unwrap(),
        panic_before
    );
    assert_eq!(
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap(),
        caches_before
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procfs_dangerous_reads_yield_nothing() {
    let Some(s) = Scene::new().await else { return };
    // kcore (host memory), kmsg (kernel log), page tables (kpagecgroup crashed a kernel once),
    // keys, timer and scheduler internals.
    for p in [
        "/proc/kcore",
        "/proc/kmsg",
        "/proc/kpagecgroup",
        "/proc/kpageflags",
        "/proc/kpagecount",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
    ] {
        let r = s
            .sh(&format!("timeout 5 head -c 4096 {p} 2>/dev/null | wc -c"))
            .await;
        assert_eq!(r.stdout.trim(), "0", "{p} yields data: {r:?}");
    }
    // dmesg needs syslog(2), which the seccomp policy does not allow.
    let r = s.sh("dmesg 2>&1 | head -c 200").await;
    assert!(
        r.stdout.contains("Operation not permitted") || r.stdout.is_empty(),
        "dmesg read the kernel log: {}",
        r.stdout
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kallsyms_addresses_are_zeroed() {
    let Some(s) = Scene::new().await else { return };
    let out = s
        .sh_ok_stdout("head -n 2000 /proc/kallsyms | awk '{print $1}' | sort -u")
        .await;
    let addrs: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert!(
        addrs.iter().all(|a| a.chars().all(|c| c == '0')),
        "kernel addresses are visible in the sandbox: {:?}",
        &addrs[..addrs.len().min(5)]
    );
    // Nor do kernel pointers show through /proc/modules or /sys/kernel/notes sections.
    let r = s
        .sh("cat /sys/module/*/sections/.text 2>/dev/null | grep -v '^0x0*$' | head -3")
        .await;
    assert!(
        r.stdout.trim().is_empty(),
        "module addresses visible: {}",
        r.stdout
    );
    s.assert_unaffected().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sysfs_is_read_only_and_masked() {
    let Some(s) = Scene::new().await else { return };
    for (what, cmd) in [
        ("ksm", "echo 1 > /sys/kernel/mm/ksm/run"),
        (
            "transparent hugepages",
            "echo never > /sys/kernel/mm/transparent_hugepage/enabled",
        ),
        ("power state", "echo mem > /sys/power/state"),
        (
            "cpu offline",
            "echo 0 > /sys/devices/system/cpu/cpu1/online",
        ),
        ("new file", "touch /sys/x"),
    ] {
        let r = s.sh(&format!("{cmd} 2>&1")).await;
        assert!(!r.success(), "{what}: `{cmd}` succeeded: {r:?}");
    }
    // Masked: firmware tables, debugfs, the host's cgroup tree.
    for dir in ["/sys/firmware", "/sys/kernel/debug", "/sys/fs/cgroup"] {
        let n = s
            .sh_ok_stdout(&format!("ls -A {dir} 2>/dev/null | wc -l"))
            .await;
        assert_eq!(n.trim(), "0", "{dir} is not empty in the sandbox");
    }
    let mounted = s.sh_ok_stdout("grep ' /sys ' /proc/self/mounts").await;
    assert!(
        mounted.contains(" ro,") || mounted.contains(" ro "),
        "/sys is not read-only: {mounted}"
    );
    s.assert_unaffected().await;
}
