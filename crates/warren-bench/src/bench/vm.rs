//! `warren-bench vm`: the microVM substrate's numbers, through the HTTP API of two private
//! daemons started for the run (same binaries, same VM directory): one creates VMs by cold
//! boot (`--vm-templates false`), the other by restoring a template snapshot.
//!
//! | what | target (software emulation) |
//! |---|---|
//! | template restore → first exec, p50 | ≤ 0.5 s and ≥ 8× faster than cold boot → first exec |
//! | snapshot of an idle 256 MiB guest (template save) | ≤ 0.3 s |
//! | host memory per idle microVM (PSS of QEMU; its cgroup) | reported, with how many fit in 20 GiB |
//! | create p50 with an allow-list policy − with `none` (interleaved, same run) | ≤ 30 ms |

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ImageRef, Substrate};

use super::{Check, Report};
use crate::stats::Latency;
use crate::table::{ms, Table};

const MEMORY_MB: u64 = 256;
const GIB_20: f64 = 20.0 * 1024.0;

/// Everything `warren-bench vm` measured.
#[derive(Debug, Default, Serialize)]
pub struct VmBench {
    /// How guest code ran (kvm or tcg), as the daemon reported it.
    pub accel: String,
    pub cold_boot_first_exec: Option<Latency>,
    pub template_restore_first_exec: Option<Latency>,
    /// Boot + snapshot + restore of the first sandbox of a machine shape.
    pub template_build_ms: Vec<f64>,
    /// Snapshot (memory + disk) of an idle 256 MiB guest at "agent ready".
    pub snapshot: Option<Latency>,
    pub density: Option<VmDensity>,
    /// Template restores (create call only) with policy `none` and with an allow list,
    /// interleaved.
    pub create_network_none: Option<Latency>,
    pub create_network_allow: Option<Latency>,
    /// The same creates until their first `exec true` has answered.
    pub first_exec_network_none: Option<Latency>,
    pub first_exec_network_allow: Option<Latency>,
}

/// Host memory of idle microVMs.
#[derive(Debug, Default, Serialize)]
pub struct VmDensity {
    pub vms: usize,
    pub rss_mib_per_vm: f64,
    pub pss_mib_per_vm: f64,
    pub cgroup_mib_per_vm: f64,
    pub mem_available_drop_mib_per_vm: f64,
    /// 20 GiB / PSS per VM.
    pub fit_in_20_gib: u64,
    pub qemu_left_after_delete: usize,
}

/// A daemon of this run.
struct Node {
    child: Child,
    client: Client,
    dir: PathBuf,
}

impl Drop for Node {
    fn drop(&mut self) {
        // SIGTERM: the daemon stops serving; the run deletes its sandboxes before.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn warrend() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    let p = exe.with_file_name("warrend");
    anyhow::ensure!(p.is_file(), "warrend not found next to {}", exe.display());
    Ok(p)
}

async fn start_node(
    root: &Path,
    name: &str,
    vm_dir: &Path,
    templates: bool,
) -> anyhow::Result<Node> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("warren.sock");
    let log = std::fs::File::create(dir.join("warrend.log"))?;
    let child = Command::new(warrend()?)
        .arg("--socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--node")
        .arg(name)
        .arg("--vm-dir")
        .arg(vm_dir)
        .arg("--vm-templates")
        .arg(templates.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting warrend")?;
    let client = Client::builder()
        .url(format!("unix://{}", sock.display()))
        .build()?;
    let mut node = Node { child, client, dir };
    let t = Instant::now();
    loop {
        if node.client.health().await.is_ok() {
            break;
        }
        if let Some(st) = node.child.try_wait()? {
            bail!(
                "warrend exited with {st}; see {}",
                node.dir.join("warrend.log").display()
            );
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("warrend did not answer in 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let h = node.client.health().await?;
    if !h.substrates.iter().any(|s| s == "microvm") {
        bail!(
            "the daemon does not serve microvm (no QEMU or guest kernel?): see {}",
            node.dir.join("warrend.log").display()
        );
    }
    Ok(node)
}

fn request(image: &str, disk_mb: u64) -> CreateSandboxRequest {
    CreateSandboxRequest {
        substrate: Substrate::Microvm,
        image: ImageRef::Name(image.to_string()),
        memory_mb: Some(MEMORY_MB),
        disk_mb: Some(disk_mb),
        labels: BTreeMap::from([("warren.bench".to_string(), "vm".to_string())]),
        ..Default::default()
    }
}

/// Create → first `exec true`; returns (ms, id).
async fn create_exec(c: &Client, req: &CreateSandboxRequest) -> anyhow::Result<(f64, String)> {
    let t = Instant::now();
    let sb = c.create(req).await.context("create")?;
    let r = c.exec(&sb.id, &ExecRequest::argv(["true"])).await;
    let elapsed = t.elapsed().as_secs_f64() * 1e3;
    let r = r.context("exec true")?;
    anyhow::ensure!(r.success(), "`true` failed in {}", sb.id);
    Ok((elapsed, sb.id))
}

/// Pid of the QEMU of sandbox `id` (its sockets are under a directory named after it).
fn qemu_pid(id: &str) -> Option<u32> {
    let rd = std::fs::read_dir("/proc").ok()?;
    for e in rd.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        if cmd.contains("qemu-system") && cmd.contains(&format!("/{id}/")) {
            return Some(pid);
        }
    }
    None
}

fn smaps_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Memory charged to the cgroup of `pid` (v1 memory controller or v2).
fn cgroup_bytes(pid: u32) -> u64 {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctl, path) = (parts.next(), parts.next(), parts.next());
        let (Some(ctl), Some(path)) = (ctl, path) else {
            continue;
        };
        let file = if ctl.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes")
        } else if ctl.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.current")
        } else {
            continue;
        };
        if let Some(v) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return v;
        }
    }
    0
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn note(msg: impl std::fmt::Display) {
    eprintln!("bench vm: {msg}");
}

pub async fn run(
    image: &str,
    n: usize,
    vms: usize,
    json: bool,
    report_dir: Option<&Path>,
) -> anyhow::Result<i32> {
    let root = std::env::temp_dir().join(format!("warren-bench-vm-{}", std::process::id()));
    let vm_dir = root.join("vm");
    let result = measure(&root, &vm_dir, image, n, vms).await;
    let _ = std::fs::remove_dir_all(&root);
    let bench = result?;
    let mut report = Report::default();
    let mut checks = Vec::new();
    if let (Some(c), Some(t)) = (
        &bench.cold_boot_first_exec,
        &bench.template_restore_first_exec,
    ) {
        checks.push(Check::at_most(
            "restore → first exec p50",
            t.p50_ms / 1e3,
            "s",
            0.5,
        ));
        checks.push(Check::at_least(
            "cold boot p50 / restore p50",
            c.p50_ms / t.p50_ms.max(1e-9),
            "x",
            8.0,
        ));
    }
    if let Some(s) = &bench.snapshot {
        checks.push(Check::at_most(
            "snapshot of idle 256 MiB guest p50",
            s.p50_ms / 1e3,
            "s",
            0.3,
        ));
    }
    if let (Some(none), Some(allow)) = (&bench.create_network_none, &bench.create_network_allow) {
        checks.push(Check::at_most(
            "allow-list network adds to create p50",
            allow.p50_ms - none.p50_ms,
            "ms",
            30.0,
        ));
    }
    if let (Some(none), Some(allow)) = (
        &bench.first_exec_network_none,
        &bench.first_exec_network_allow,
    ) {
        checks.push(Check::at_most(
            "allow-list network adds to create → first exec p50",
            allow.p50_ms - none.p50_ms,
            "ms",
            30.0,
        ));
    }
    if let Some(d) = &bench.density {
        checks.push(Check::at_most(
            "QEMU left after delete",
            d.qemu_left_after_delete as f64,
            "",
            0.0,
        ));
    }
    report.checks = checks;
    let v = serde_json::json!({ "vm": bench, "checks": report.checks });
    let text = render(&bench, &report);
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print!("{text}");
    }
    super::report::write_if(report_dir, || {
        super::report::Page::new("warren bench vm", text.clone(), &v)
    })?;
    Ok(0)
}

/// The text report of `bench vm`.
fn render(bench: &VmBench, report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "acceleration: {}", bench.accel);
    let mut t = Table::new(["BENCH", "N", "P50 ms", "MEAN ms", "MIN ms", "MAX ms"]);
    for (name, l) in [
        ("cold boot → first exec", &bench.cold_boot_first_exec),
        (
            "template restore → first exec",
            &bench.template_restore_first_exec,
        ),
        ("snapshot (idle 256 MiB guest)", &bench.snapshot),
        ("create, network none", &bench.create_network_none),
        ("create, network allow list", &bench.create_network_allow),
        ("create → first exec, none", &bench.first_exec_network_none),
        (
            "create → first exec, allow list",
            &bench.first_exec_network_allow,
        ),
    ] {
        if let Some(l) = l {
            t.row([
                name.to_string(),
                l.n.to_string(),
                ms(l.p50_ms),
                ms(l.mean_ms),
                ms(l.min_ms),
                ms(l.max_ms),
            ]);
        }
    }
    out.push_str(&t.render());
    let _ = writeln!(
        out,
        "template build (boot + snapshot + restore, first create of a shape): {:?} ms",
        bench
            .template_build_ms
            .iter()
            .map(|v| v.round())
            .collect::<Vec<_>>()
    );
    if let Some(d) = &bench.density {
        let _ = writeln!(
            out,
            "density: {} idle microVMs of {MEMORY_MB} MiB: RSS {:.1} MiB, PSS {:.1} MiB, cgroup {:.1} MiB, MemAvailable drop {:.1} MiB per VM → {} fit in 20 GiB (by PSS); {} QEMU left after delete",
            d.vms,
            d.rss_mib_per_vm,
            d.pss_mib_per_vm,
            d.cgroup_mib_per_vm,
            d.mem_available_drop_mib_per_vm,
            d.fit_in_20_gib,
            d.qemu_left_after_delete
        );
    }
    out.push('\n');
    out.push_str(&report.render());
    out
}

/// Creates (the API call, until the sandbox serves; and until its first `exec true`
/// answered) of template restores with policy `none` and with an allow list (one address,
/// one port: a link, its rules and resolver, the guest's interface configured), alternating
/// so both see the same host load. Each shape's template is made first, outside the samples.
/// Returns create none, create allow, first exec none, first exec allow.
async fn measure_network(c: &Client, image: &str, n: usize) -> anyhow::Result<[Latency; 4]> {
    let none = request(image, 1024);
    let mut allow = request(image, 1024);
    allow.network = serde_json::from_value(serde_json::json!({
        "allow": [{"cidr": "10.255.255.1/32", "ports": 80, "protocol": "tcp"}]
    }))?;
    note(format!(
        "{n} creates with network none and {n} with an allow list"
    ));
    for req in [&none, &allow] {
        let (_, id) = create_exec(c, req).await?;
        c.delete(&id).await?;
    }
    let mut ms: [Vec<f64>; 4] = Default::default();
    for _ in 0..n {
        for (i, req) in [&none, &allow].into_iter().enumerate() {
            let t = Instant::now();
            let sb = c.create(req).await.context("create")?;
            ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            let r = c.exec(&sb.id, &ExecRequest::argv(["true"])).await;
            ms[i + 2].push(t.elapsed().as_secs_f64() * 1e3);
            anyhow::ensure!(
                r.context("exec true")?.success(),
                "`true` failed in {}",
                sb.id
            );
            c.delete(&sb.id).await?;
        }
    }
    Ok(ms.map(Latency::from_samples))
}

async fn measure(
    root: &Path,
    vm_dir: &Path,
    image: &str,
    n: usize,
    vms: usize,
) -> anyhow::Result<VmBench> {
    let mut bench = VmBench::default();
    let cold = start_node(
        root,
        &format!("bvc{}", std::process::id() % 100000),
        vm_dir,
        false,
    )
    .await?;
    let warm = start_node(
        root,
        &format!("bvw{}", std::process::id() % 100000),
        vm_dir,
        true,
    )
    .await?;

    // Cold boots (fewer: each costs seconds under software emulation).
    let n_cold = n.div_ceil(2).max(2);
    note(format!("{n_cold} cold boots"));
    let mut cold_ms = Vec::new();
    for _ in 0..n_cold {
        let (t, id) = create_exec(&cold.client, &request(image, 1024)).await?;
        cold.client.delete(&id).await?;
        cold_ms.push(t);
    }
    bench.cold_boot_first_exec = Some(Latency::from_samples(cold_ms));

    // Templates: the first create of each shape boots and snapshots once.
    let shapes = 3;
    note(format!("{shapes} templates (one boot and snapshot each)"));
    for i in 0..shapes {
        let (t, id) = create_exec(&warm.client, &request(image, 1024 + 16 * i as u64)).await?;
        warm.client.delete(&id).await?;
        bench.template_build_ms.push(t);
    }
    let mut snaps = Vec::new();
    for e in std::fs::read_dir(vm_dir.join("templates"))?.flatten() {
        let meta = std::fs::read_to_string(e.path().join("snapshot.json")).unwrap_or_default();
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&meta) {
            if let Some(s) = v.get("save_secs").and_then(|s| s.as_f64()) {
                snaps.push(s * 1e3);
            }
            if let Some(a) = v.pointer("/machine/accel").and_then(|a| a.as_str()) {
                bench.accel = a.to_string();
            }
        }
    }
    bench.snapshot = Some(Latency::from_samples(snaps));

    note(format!("{n} template restores"));
    let mut warm_ms = Vec::new();
    for _ in 0..n {
        let (t, id) = create_exec(&warm.client, &request(image, 1024)).await?;
        warm.client.delete(&id).await?;
        warm_ms.push(t);
    }
    bench.template_restore_first_exec = Some(Latency::from_samples(warm_ms));

    let [none, allow, none_exec, allow_exec] = measure_network(&warm.client, image, n).await?;
    bench.create_network_none = Some(none);
    bench.create_network_allow = Some(allow);
    bench.first_exec_network_none = Some(none_exec);
    bench.first_exec_network_allow = Some(allow_exec);

    if vms > 0 {
        note(format!("{vms} idle microVMs for memory"));
        let before = mem_available_kib();
        let mut ids = Vec::new();
        for _ in 0..vms {
            let (_, id) = create_exec(&warm.client, &request(image, 1024)).await?;
            ids.push(id);
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = mem_available_kib();
        let (mut rss, mut pss, mut cg) = (0u64, 0u64, 0u64);
        let mut pids = Vec::new();
        for id in &ids {
            if let Some(pid) = qemu_pid(id) {
                rss += smaps_kib(pid, "Rss:");
                pss += smaps_kib(pid, "Pss:");
                cg += cgroup_bytes(pid) / 1024;
                pids.push(id.clone());
            }
        }
        for id in &ids {
            warm.client.delete(id).await?;
        }
        let k = pids.len().max(1) as f64;
        let pss_mib = pss as f64 / 1024.0 / k;
        bench.density = Some(VmDensity {
            vms: pids.len(),
            rss_mib_per_vm: rss as f64 / 1024.0 / k,
            pss_mib_per_vm: pss_mib,
            cgroup_mib_per_vm: cg as f64 / 1024.0 / k,
            mem_available_drop_mib_per_vm: before.saturating_sub(after) as f64 / 1024.0 / k,
            fit_in_20_gib: if pss_mib > 0.0 {
                (GIB_20 / pss_mib) as u64
            } else {
                0
            },
            qemu_left_after_delete: ids.iter().filter(|id| qemu_pid(id).is_some()).count(),
        });
    }
    drop((cold, warm));
    Ok(bench)
}
