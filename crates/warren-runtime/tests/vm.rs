//! Real QEMU VM sandboxes (root only). Skips, saying why, when QEMU or the guest kernel is
//! missing. VMs under TCG are slow, so the tests are few and each does several checks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use warren_image::ImageStore;
use warren_proto::ExecSpec;
use warren_runtime::vm::Vm;
use warren_runtime::vm::{VmConfig, VmRuntime};
use warren_runtime::{Instance, Runtime, SandboxSpec};
use warren_types::{Limits, NodeId, SandboxId, Substrate};

mod common;

struct Env {
    rt: VmRuntime,
    store: Arc<ImageStore>,
    node: NodeId,
    root: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed check leaves its VMs running: they go with the test.
        if std::thread::panicking() {
            common::kill_node_cgroups(&self.node);
        }
    }
}

fn setup(substrate: Substrate, templates: bool) -> Option<Env> {
    let (agent, store) = common::prerequisites("VM", false)?;
    // Host tools run through the reaper, as in the daemon.
    warren_runtime::reaper::start().unwrap();
    let node = common::node("vm");
    let base = std::env::var("WARREN_TEST_DIR").unwrap_or_else(|_| "/tmp/warren-tests".into());
    // Bases and templates are shared by every test run (they are caches); sandboxes are not.
    let root = PathBuf::from(base).join("vm-runtime");
    let mut cfg = VmConfig::new(node.clone(), agent, root.clone());
    cfg.templates = templates;
    if let Some(why) = cfg.unavailable() {
        common::skip(why);
        return None;
    }
    let rt = VmRuntime::new(cfg, substrate, store.clone()).unwrap();
    Some(Env {
        rt,
        store,
        node,
        root,
    })
}

fn spec(node: &NodeId, memory_mb: u64) -> SandboxSpec {
    SandboxSpec {
        id: SandboxId::generate(node),
        image: vec!["default".into()],
        limits: Limits {
            memory_mb,
            disk_mb: 512,
            ..Limits::default()
        },
        hostname: "vmbox".into(),
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

async fn run(sb: &Arc<dyn Instance>, cmd: &str) -> (i32, String) {
    let out = sb.agent().exec(sh(cmd), None).await.expect("exec");
    (
        out.exit.exit_code.unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn qemu_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
        .map(|c| c.contains("qemu"))
        .unwrap_or(false)
}

fn vm_of(sb: &Arc<dyn Instance>) -> &Vm {
    sb.as_any().downcast_ref::<Vm>().expect("a VM")
}

async fn write(sb: &Arc<dyn Instance>, path: &str, data: &[u8]) {
    let mut w = sb
        .agent()
        .write_file(path, None, None)
        .await
        .expect("write_file");
    w.write(bytes::Bytes::copy_from_slice(data)).await.unwrap();
    w.finish().await.unwrap();
}

async fn read(sb: &Arc<dyn Instance>, path: &str) -> Vec<u8> {
    let mut r = sb.agent().read_file(path).await.expect("read_file");
    let mut out = Vec::new();
    while let Some(chunk) = r.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

/// Asserts that nothing of a destroyed VM is left: no QEMU, no directory, no socket.
fn assert_gone(pid: u32, dir: &std::path::Path) {
    assert!(!qemu_alive(pid), "QEMU {pid} still runs");
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn microvm_boots_runs_commands_and_files_and_leaves_nothing() {
    let Some(env) = setup(Substrate::Microvm, false) else {
        return;
    };
    let t = Instant::now();
    let sb: Arc<dyn Instance> = env.rt.boot(&spec(&env.node, 256)).await.expect("boot");
    eprintln!(
        "cold boot to agent ready: {:?} ({})",
        t.elapsed(),
        env.rt.describe()
    );
    let (pid, dir) = (vm_of(&sb).qemu_pid(), vm_of(&sb).dir().to_path_buf());

    // A real guest kernel, the image's root, our hostname.
    let (code, out) = run(&sb, "echo hello; hostname; cat /etc/debian_version; test -x /usr/bin/python3 && echo py; cat /proc/1/comm").await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("hello\nvmbox\n12."), "{out}");
    assert!(out.contains("py\n"), "{out}");
    let (_, kernel) = run(&sb, "uname -r").await;
    assert_ne!(
        kernel.trim(),
        nix::sys::utsname::uname()
            .unwrap()
            .release()
            .to_string_lossy(),
        "runs on the host kernel"
    );

    // Files both ways, on the writable disk.
    write(&sb, "/root/in.txt", b"from the host").await;
    let (code, out) = run(
        &sb,
        "cat /root/in.txt; echo -n guest > /tmp/out.txt; df -T / | tail -1",
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.starts_with("from the host"), "{out}");
    assert!(out.contains("overlay"), "root is not the overlay: {out}");
    assert_eq!(read(&sb, "/tmp/out.txt").await, b"guest");

    // Timeout and output cap.
    let mut spec = sh("echo start; sleep 30");
    spec.timeout_ms = Some(500);
    let t = Instant::now();
    let out = sb.agent().exec(spec, None).await.unwrap();
    assert!(out.exit.timed_out, "{:?}", out.exit);
    assert!(t.elapsed().as_secs() < 20);
    let mut spec = sh("head -c 300000 /dev/zero");
    spec.output_cap = 1000;
    let out = sb.agent().exec(spec, None).await.unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.exit.stdout_truncated);
    assert_eq!(out.exit.stdout_bytes, 300000);

    // The VMM is charged to the sandbox's cgroup.
    let used = sb.usage().memory_bytes.unwrap_or(0);
    assert!(
        used > 32 << 20,
        "cgroup memory {used} does not include QEMU"
    );

    sb.destroy().await.unwrap();
    assert_gone(pid, &dir);
    sb.destroy().await.expect("destroy is idempotent");
    env.rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_restores_are_independent_and_snapshots_keep_processes() {
    let Some(env) = setup(Substrate::Microvm, true) else {
        return;
    };
    // The first create boots the template; both sandboxes are restores of it.
    let t = Instant::now();
    let a = env
        .rt
        .create(&spec(&env.node, 256))
        .await
        .expect("create a");
    eprintln!("first create (template made if missing): {:?}", t.elapsed());
    let t = Instant::now();
    let b = env
        .rt
        .create(&spec(&env.node, 256))
        .await
        .expect("create b");
    eprintln!("create by template restore: {:?}", t.elapsed());
    assert!(vm_of(&b).machine().memory_mb == 256);
    // Each VM leases the layers it uses as disks, so no collection deletes them under it.
    let leased = |id: &str| {
        env.store
            .leases()
            .into_iter()
            .find(|(h, _)| h == id)
            .map(|(_, f)| f.layers)
    };
    for sb in [&a, &b] {
        let layers = leased(sb.id().as_str()).expect("the VM holds no lease");
        assert_eq!(layers, vm_of(sb).machine().layers);
    }
    let (_, host) = run(&b, "hostname").await;
    assert_eq!(
        host.trim(),
        "vmbox",
        "a restored sandbox takes its own hostname"
    );

    // Independent disks: what one writes the other never sees.
    write(&a, "/root/who", b"a").await;
    write(&b, "/root/who", b"b").await;
    assert_eq!(read(&a, "/root/who").await, b"a");
    assert_eq!(read(&b, "/root/who").await, b"b");
    write(&a, "/root/only-a", b"x").await;
    let (_, out) = run(&b, "ls /root").await;
    assert!(!out.contains("only-a"), "{out}");

    // A running counter and a file survive snapshot → restore into a new sandbox.
    write(&a, "/root/note", b"kept").await;
    let mut counter = sh("i=0; while true; do i=$((i+1)); echo $i > /root/count.t; mv /root/count.t /root/count; sleep 0.1; done");
    counter.output_cap = 0;
    a.agent().spawn(counter).await.unwrap();
    // Wait for a few ticks; a TCG guest on a loaded host ticks slowly, so poll (bounded).
    let mut pre = 0u64;
    for _ in 0..60 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (_, out) = run(&a, "cat /root/count 2>/dev/null").await;
        pre = out.trim().parse().unwrap_or(0);
        if pre > 3 {
            break;
        }
    }
    assert!(pre > 3, "counter is not running after 30 s: {pre}");
    let snapdir = env.root.join(format!("snap-{}", a.id()));
    let t = Instant::now();
    let snap = env
        .rt
        .snapshot(vm_of(&a), &snapdir)
        .await
        .expect("snapshot");
    eprintln!("snapshot of a running 256 MiB guest: {:?}", t.elapsed());
    let (pid_a, dir_a) = (vm_of(&a).qemu_pid(), vm_of(&a).dir().to_path_buf());
    a.destroy().await.unwrap();
    assert_gone(pid_a, &dir_a);
    assert!(
        leased(a.id().as_str()).is_none(),
        "the lease outlived the VM"
    );

    let t = Instant::now();
    let c: Arc<dyn Instance> = env
        .rt
        .restore(&spec(&env.node, 256), &snap)
        .await
        .expect("restore");
    eprintln!("restore of the snapshot: {:?}", t.elapsed());
    assert_eq!(read(&c, "/root/note").await, b"kept");
    let (_, n1) = run(&c, "cat /root/count").await;
    let n1: u64 = n1.trim().parse().unwrap();
    // The counter goes on (a guest starved by a loaded host may take a while to tick).
    let mut n2 = n1;
    for _ in 0..20 {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let (_, n) = run(&c, "cat /root/count").await;
        n2 = n.trim().parse().unwrap_or(n1);
        if n2 > n1 {
            break;
        }
    }
    assert!(
        n1 >= pre && n2 > n1,
        "counter did not continue: {pre} → {n1} → {n2}"
    );
    let procs = c.agent().list_procs().await.unwrap();
    assert!(
        !procs.is_empty(),
        "the background process is not listed after restore"
    );

    for sb in [b, c] {
        let (pid, dir) = (vm_of(&sb).qemu_pid(), vm_of(&sb).dir().to_path_buf());
        sb.destroy().await.unwrap();
        assert_gone(pid, &dir);
    }
    std::fs::remove_dir_all(&snapdir).unwrap();
    env.rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_qemu_is_noticed() {
    let Some(env) = setup(Substrate::Microvm, true) else {
        return;
    };
    let sb = env.rt.create(&spec(&env.node, 256)).await.expect("create");
    let (pid, dir) = (vm_of(&sb).qemu_pid(), vm_of(&sb).dir().to_path_buf());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(10), sb.lost())
        .await
        .expect("the VMM's death is noticed");
    assert!(sb.agent().exec(sh("true"), None).await.is_err());
    sb.destroy().await.unwrap();
    assert_gone(pid, &dir);
    env.rt.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_vm_boots_from_a_system_disk_on_a_backing_chain() {
    let Some(env) = setup(Substrate::Vm, false) else {
        return;
    };
    let sb: Arc<dyn Instance> = env.rt.boot(&spec(&env.node, 384)).await.expect("boot");
    let (pid, dir) = (vm_of(&sb).qemu_pid(), vm_of(&sb).dir().to_path_buf());
    let (code, out) = run(
        &sb,
        "df -T / | tail -1; echo x > /etc/written; cat /etc/written",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("ext4"), "root is not the system disk: {out}");
    // The writable disk is a qcow2 overlay naming a backing file (read from its header: a
    // child process here would race the reaper started above for its exit status).
    let backing = qcow2_backing_file(&dir.join("disk.qcow2"));
    assert!(
        backing.as_deref().is_some_and(|b| !b.is_empty()),
        "no backing chain: {backing:?}"
    );
    sb.destroy().await.unwrap();
    assert_gone(pid, &dir);
    env.rt.shutdown();
}

/// The backing file named in a qcow2 header, if any.
fn qcow2_backing_file(path: &std::path::Path) -> Option<String> {
    use std::io::Read;
    let mut head = vec![0u8; 64 * 1024];
    let n = std::fs::File::open(path).unwrap().read(&mut head).unwrap();
    head.truncate(n);
    assert_eq!(&head[..4], b"QFI\xfb", "not a qcow2 file");
    let be64 = |o: usize| u64::from_be_bytes(head[o..o + 8].try_into().unwrap());
    let be32 = |o: usize| u32::from_be_bytes(head[o..o + 4].try_into().unwrap());
    let (off, len) = (be64(8) as usize, be32(16) as usize);
    if off == 0 || off + len > head.len() {
        return None;
    }
    Some(String::from_utf8_lossy(&head[off..off + len]).into_owned())
}
