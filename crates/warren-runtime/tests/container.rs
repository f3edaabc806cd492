//! Real container sandboxes (root only). Skips, saying why, when it cannot run here.

use warren_proto::ExecSpec;
use warren_runtime::container::ContainerRuntime;
use warren_runtime::{Runtime, SandboxSpec};
use warren_types::{Limits, NodeId, SandboxId};

mod common;

fn setup() -> Option<(ContainerRuntime, NodeId)> {
    common::container_runtime()
}

fn spec(node: &NodeId) -> SandboxSpec {
    SandboxSpec {
        id: SandboxId::generate(node),
        image: vec!["default".into()],
        limits: Limits {
            memory_mb: 256,
            ..Limits::default()
        },
        hostname: "sandbox".into(),
        labels: Default::default(),
        devpts: false,
        network: false,
        resolv_conf: None,
        on_netns: None,
    }
}

fn sh(cmd: &str) -> ExecSpec {
    ExecSpec {
        argv: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        output_cap: 1 << 20,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_runs_commands_in_isolation() {
    let Some((rt, node)) = setup() else { return };
    let sb = rt.create(&spec(&node)).await.expect("create");
    let out = sb
        .agent()
        .exec(
            sh("echo hello; id -u; hostname; cat /proc/1/cmdline | tr '\\0' ' '"),
            None,
        )
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!(
        "stdout: {text} stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.exit.exit_code, Some(0));
    assert!(text.starts_with("hello\n0\nsandbox\n"), "{text}");
    // Host processes are invisible.
    let out = sb
        .agent()
        .exec(sh("ls /proc | grep -c '^[0-9]'"), None)
        .await
        .unwrap();
    let n: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(n < 10, "sees {n} processes");
    // Only loopback.
    let out = sb
        .agent()
        .exec(
            sh("cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "lo");
    // The kernel page maps are masked.
    let out = sb
        .agent()
        .exec(sh("head -c 8 /proc/kpagecgroup | wc -c"), None)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    // Writes land in the writable layer; the image stays untouched.
    let out = sb
        .agent()
        .exec(sh("echo data > /etc/newfile && cat /etc/newfile"), None)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "data\n");
    let st = sb.agent().stat("/etc/newfile").await.unwrap();
    assert_eq!(st.size, 5);
    sb.destroy().await.unwrap();
    let left = rt.reconcile(&[]).await.unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
    rt.shutdown();
}

async fn run(
    sb: &std::sync::Arc<dyn warren_runtime::Instance>,
    cmd: &str,
) -> (Option<i32>, String) {
    let out = sb.agent().exec(sh(cmd), None).await.unwrap();
    (
        out.exit.exit_code,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

/// The namespace's inode (namespaces are told apart by it).
fn ns_inode(fd: &impl std::os::fd::AsFd) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::File::from(fd.as_fd().try_clone_to_owned().unwrap())
        .metadata()
        .unwrap()
        .ino()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_namespace_is_handed_over_while_the_sandbox_starts() {
    let Some((rt, node)) = setup() else { return };
    // What the hook saw: the namespace's inode, and whether the start was still going on.
    // (Recorded, not asserted, inside the hook: a panic there would cut the start short and
    // leave the sandbox behind.)
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Option<u64>, bool)>::new()));
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, done) = (seen.clone(), started.clone());
    let mut spec = spec(&node);
    spec.on_netns = Some(warren_runtime::NetnsHook::new(move |pid| {
        let going_on = !done.load(std::sync::atomic::Ordering::SeqCst);
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).ok();
        s.lock()
            .unwrap()
            .push((ns.map(|ns| ns_inode(&ns)), going_on));
    }));
    let sb = rt.create(&spec).await.expect("create");
    started.store(true, std::sync::atomic::Ordering::SeqCst);
    let seen = seen.lock().unwrap().clone();
    let pid = sb.netns_pid().expect("a container has a network namespace");
    let theirs = ns_inode(&std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap());
    let ours = ns_inode(&std::fs::File::open("/proc/self/ns/net").unwrap());
    sb.destroy().await.unwrap();
    let left = rt.reconcile(&[]).await.unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
    rt.shutdown();
    assert_eq!(seen.len(), 1, "handed over once: {seen:?}");
    assert!(seen[0].1, "handed over before the start ended");
    assert_eq!(
        seen[0].0,
        Some(theirs),
        "the sandbox's own namespace, open while handed over"
    );
    assert_ne!(seen[0].0, Some(ours), "not the host's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume_keep_files_and_processes() {
    let Some((rt, node)) = setup() else { return };
    warren_runtime::reaper::start().unwrap();
    let sb = rt.create(&spec(&node)).await.expect("create");
    let counter = ExecSpec {
        argv: vec![
            "/bin/sh".into(),
            "-c".into(),
            "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.t; mv /tmp/count.t /tmp/count; sleep 0.05; done".into(),
        ],
        output_cap: 1024,
        ..Default::default()
    };
    sb.agent().spawn(counter).await.unwrap();
    run(
        &sb,
        "head -c 20000000 /dev/urandom > /root/blob && sha256sum /root/blob > /root/sum",
    )
    .await;
    for _ in 0..100 {
        sb.pause().await.unwrap();
        assert!(sb.is_paused());
        sb.resume().await.unwrap();
        assert!(!sb.is_paused());
    }
    let (code, _) = run(&sb, "sha256sum -c /root/sum").await;
    assert_eq!(code, Some(0));
    let (_, a) = run(&sb, "cat /tmp/count").await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, b) = run(&sb, "cat /tmp/count").await;
    assert!(
        b.parse::<u64>().unwrap() > a.parse::<u64>().unwrap(),
        "the background counter kept running ({a} -> {b})"
    );
    sb.destroy().await.unwrap();
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_children_start_from_the_parent_and_stay_isolated() {
    let Some((rt, node)) = setup() else { return };
    warren_runtime::reaper::start().unwrap();
    let parent = rt.create(&spec(&node)).await.expect("create");
    let (code, _) = run(
        &parent,
        "mkdir -p /work && echo parent > /work/a.txt && rm /etc/issue && chmod 0600 /work/a.txt",
    )
    .await;
    assert_eq!(code, Some(0));
    let specs: Vec<SandboxSpec> = (0..3).map(|_| spec(&node)).collect();
    let kids = rt.fork(&parent, &specs).await.expect("fork");
    assert_eq!(kids.len(), 3);
    for k in &kids {
        assert_eq!(run(k, "cat /work/a.txt").await.1, "parent");
        assert_eq!(run(k, "stat -c %a /work/a.txt").await.1, "600");
        assert_eq!(
            run(k, "test -e /etc/issue; echo $?").await.1,
            "1",
            "a deletion in the parent stays deleted"
        );
        assert_eq!(
            run(k, "stat -c %U /usr/bin/python3 /work/a.txt | sort -u")
                .await
                .1,
            "root"
        );
    }
    run(&kids[0], "echo mine > /work/b.txt").await;
    assert_eq!(run(&kids[1], "test -e /work/b.txt; echo $?").await.1, "1");
    assert_eq!(run(&parent, "test -e /work/b.txt; echo $?").await.1, "1");
    run(&parent, "echo later > /work/c.txt").await;
    assert_eq!(run(&kids[2], "test -e /work/c.txt; echo $?").await.1, "1");
    for k in kids {
        k.destroy().await.unwrap();
    }
    parent.destroy().await.unwrap();
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_pushes_anonymous_memory_out_when_the_host_has_swap() {
    let Some((rt, node)) = setup() else { return };
    let swap = std::fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().count() > 1)
        .unwrap_or(false);
    let mut sp = spec(&node);
    sp.limits.memory_mb = 1024;
    let sb = rt.create(&sp).await.expect("create");
    let hog = ExecSpec {
        argv: vec![
            "python3".into(),
            "-c".into(),
            "import os,time\nb=bytearray(os.urandom(1<<20))*512\nopen('/tmp/ready','w').close()\ntime.sleep(3600)".into(),
        ],
        output_cap: 1024,
        ..Default::default()
    };
    sb.agent().spawn(hog).await.unwrap();
    for _ in 0..200 {
        if run(&sb, "test -e /tmp/ready && echo y").await.1 == "y" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let stats = sb.pause().await.unwrap();
    let out = stats
        .memory_before_bytes
        .saturating_sub(stats.memory_after_bytes);
    eprintln!(
        "pause of a 512 MiB sandbox: {:.0} ms, {} MiB -> {} MiB ({:.0}% out), swap: {swap}, note: {:?}",
        stats.duration_ms,
        stats.memory_before_bytes >> 20,
        stats.memory_after_bytes >> 20,
        100.0 * out as f64 / stats.memory_before_bytes.max(1) as f64,
        stats.note
    );
    assert!(stats.memory_before_bytes > 500 << 20);
    if swap {
        assert!(
            stats.memory_after_bytes < stats.memory_before_bytes / 10,
            "{stats:?}"
        );
        assert!(stats.note.is_none());
    } else {
        eprintln!("SKIP part: no swap on this host, memory stays in RAM (the note says so)");
        assert!(stats.note.is_some());
    }
    let t = std::time::Instant::now();
    sb.resume().await.unwrap();
    let (code, _) = run(&sb, "true").await;
    eprintln!(
        "resume to first exec: {:.1} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    assert_eq!(code, Some(0));
    sb.destroy().await.unwrap();
    rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_16_of_a_200_mib_writable_layer() {
    let Some((rt, node)) = setup() else { return };
    warren_runtime::reaper::start().unwrap();
    let mut sp = spec(&node);
    sp.limits.memory_mb = 1024;
    sp.limits.disk_mb = 1024;
    let parent = rt.create(&sp).await.expect("create");
    let (code, _) = run(&parent, "mkdir -p /data && head -c 209715200 /dev/urandom > /data/blob && sha256sum /data/blob > /data/sum").await;
    assert_eq!(code, Some(0));
    let specs: Vec<SandboxSpec> = (0..16).map(|_| spec(&node)).collect();
    let t = std::time::Instant::now();
    let kids = rt.fork(&parent, &specs).await.expect("fork");
    eprintln!(
        "fork(16) of a 200 MiB writable layer: {:.2} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(kids.len(), 16);
    for k in [&kids[0], &kids[15]] {
        assert_eq!(
            run(k, "sha256sum -c /data/sum >/dev/null; echo $?").await.1,
            "0"
        );
    }
    for k in kids {
        k.destroy().await.unwrap();
    }
    parent.destroy().await.unwrap();
    rt.shutdown();
}

/// Whether `pid` is gone or exited (a zombie nobody collected yet).
fn ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// Waits (at most 10 s) until `rt` has `n` agents parked.
async fn parked(rt: &ContainerRuntime, n: usize) -> Vec<u32> {
    for _ in 0..200 {
        let p = rt.parked_agents();
        if p.len() >= n {
            return p;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{n} agents were never parked: {:?}", rt.parked_agents());
}

/// Agents started ahead of creates: a create takes a parked one (which then runs in the
/// sandbox's cgroups) and another is parked; parked agents killed from outside are passed
/// over; a runtime that goes away takes its parked agents with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_agents_serve_creates_and_end_with_their_runtime() {
    let Some((rt, node)) = setup() else { return };
    warren_runtime::reaper::start().unwrap();
    let before = parked(&rt, 2).await;
    let taken = *before.last().unwrap();
    let sb = rt.create(&spec(&node)).await.expect("create");
    assert!(
        !rt.parked_agents().contains(&taken),
        "{taken} is still parked"
    );
    if let Ok(cg) = std::fs::read_to_string(format!("/proc/{taken}/cgroup")) {
        assert!(
            ended(taken) || cg.contains(sb.id().as_str()),
            "the taken agent is not in its sandbox's cgroups: {cg}"
        );
    }
    assert_eq!(run(&sb, "echo ok").await, (Some(0), "ok".to_string()));
    parked(&rt, 2).await;

    // Parked agents that die are passed over.
    for pid in rt.parked_agents() {
        let _ = warren_sys::process::kill(pid, libc::SIGKILL);
    }
    let sb2 = rt
        .create(&spec(&node))
        .await
        .expect("create after the parked agents died");
    assert_eq!(run(&sb2, "echo ok").await, (Some(0), "ok".to_string()));

    // Shutting the runtime down ends its parked agents.
    let left = parked(&rt, 2).await;
    sb.destroy().await.unwrap();
    sb2.destroy().await.unwrap();
    rt.shutdown();
    for _ in 0..200 {
        if left.iter().all(|p| ended(*p)) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("parked agents outlived their runtime's shutdown: {left:?}");
}

/// The agent the suite runs is the static one the build scripts make (`build_release` in
/// `scripts/lib.sh`): a build that silently fell back to glibc's would cost every sandbox
/// start about 1 ms of CPU on a VM and still pass every other test.
#[test]
fn the_agent_is_a_static_program() {
    let Some(agent) = common::agent_bin() else {
        common::skip("warren-agent not built (scripts/test.sh builds it)");
        return;
    };
    match warren_runtime::program::linkage(&agent).unwrap() {
        warren_runtime::program::Linkage::Static => {}
        warren_runtime::program::Linkage::Dynamic => common::skip(format!(
            "{} is dynamically linked: build it with build_release (scripts/lib.sh), which \
             needs the Rust target {}-unknown-linux-musl",
            agent.display(),
            std::env::consts::ARCH
        )),
    }
}

/// The cgroup v2 options of this host, from the first `cgroup2` line of mountinfo.
fn v2_options() -> Option<Vec<String>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let (_, post) = l.split_once(" - ")?;
        let f: Vec<&str> = post.split(' ').collect();
        (f.first() == Some(&"cgroup2")).then(|| {
            f.get(2)
                .unwrap_or(&"")
                .split(',')
                .map(String::from)
                .collect()
        })
    })
}

/// A runtime sets `favordynmods` on the v2 hierarchy (so moving an agent into its groups does
/// not wait for an RCU grace period) and keeps every option the hierarchy had.
#[test]
fn the_runtime_sets_favordynmods_and_keeps_the_other_cgroup_options() {
    let Some(before) = v2_options() else {
        common::skip("no cgroup v2 hierarchy on this host");
        return;
    };
    let Some((rt, _)) = setup() else { return };
    let after = v2_options().unwrap();
    assert!(after.iter().any(|o| o == "favordynmods"), "{after:?}");
    for o in &before {
        assert!(after.contains(o), "lost {o}: {before:?} -> {after:?}");
    }
    rt.shutdown();
}

/// Output a command wrote before it exited reaches a reader that was slow to ask for it: the
/// command fills the credit window and leaves the rest in its pipe as it exits, and the reader
/// takes nothing for a second (longer than the agent's drain grace). Every byte comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_left_in_the_pipe_at_exit_reaches_a_slow_reader() {
    use warren_runtime::agent::StreamItem;
    let Some((rt, node)) = setup() else { return };
    let sb = rt.create(&spec(&node)).await.expect("create");
    // The window (512 KiB) and 60,000 bytes more: they fit in the pipe, so the command exits.
    const WANT: usize = 512 * 1024 + 60_000;
    let mut stream = sb
        .agent()
        .exec_stream(sh(&format!("head -c {WANT} /dev/zero | tr '\\0' a")), None)
        .await
        .expect("exec_stream");
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let (mut got, mut exit) = (0usize, None);
    while let Some(item) = stream.next().await {
        match item.expect("stream item") {
            StreamItem::Stdout(b) => got += b.len(),
            StreamItem::Stderr(b) => panic!("stderr: {}", String::from_utf8_lossy(&b)),
            StreamItem::Exit(e) => exit = Some(e),
        }
    }
    // Removed before the checks: a failed check must not leave the sandbox running.
    sb.destroy().await.unwrap();
    rt.shutdown();
    assert_eq!(exit.and_then(|e| e.exit_code), Some(0));
    assert_eq!(got, WANT, "bytes of the command's output delivered");
}
