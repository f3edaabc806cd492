//! `warren-bench vm`: the microVM substrate's numbers, through the HTTP API of two private
//! daemons started for the run (same binaries, same VM directory): one creates VMs by cold
//! boot (`--vm-templates false`), the other by restoring a template snapshot.
//!
//! | what | target (software emulation) |
//! |---|---|
//! | template restore → first exec, p50 | ≤ 0.5 s and ≥ 8× faster than cold boot → first exec |
//! | snapshot of an idle 256 MiB guest (template save) | ≤ 0.3 s |
//! | host memory per idle 256 MiB microVM (PSS of QEMU: guest RAM, TCG cache, QEMU's own) | ≤ 48 MiB (≥ 400 fit in 20 GiB) |
//! | pause of a microVM that wrote 200 MiB: share of it out of RAM (cgroup), time | ≥ 80 % within 2 s |
//! | resume → first exec after a pause | ≤ 150 ms plus page-in (reported) |
//! | `fork -n 8` of an idle microVM; the children's first exec | ≤ 2 s; reported |
//! | create p50 with an allow-list policy − with `none` (interleaved, same run) | ≤ 30 ms |

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde::Serialize;
use warren_client::{Client, CreateSandboxRequest, ExecRequest, ImageRef, Substrate};

use super::daemon::Daemon;
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
    pub pause: Option<VmPause>,
    /// `fork -n 8` of an idle microVM, and the children's first exec after it.
    pub fork8_ms: Option<f64>,
    pub fork_child_first_exec: Option<Latency>,
}

/// Pause of a microVM whose guest wrote [`PAUSE_TOUCH_MIB`] (random data, a file).
#[derive(Debug, Default, Serialize)]
pub struct VmPause {
    pub cycles: usize,
    /// The daemon's pause report: time, cgroup memory before and after (p50 over cycles).
    pub pause_ms: Option<Latency>,
    pub cgroup_before_mib: f64,
    pub cgroup_after_mib: f64,
    /// Of the memory the guest touched, the share that left the sandbox's cgroup.
    pub out_of_cgroup_share: f64,
    /// PSS of QEMU before and after the first pause.
    pub pss_before_mib: f64,
    pub pss_after_mib: f64,
    /// What zram took for it (compressed), when the host's swap is zram.
    pub zram_growth_mib: f64,
    pub resume_first_exec: Option<Latency>,
}

/// What the guest writes before the pause bench.
const PAUSE_TOUCH_MIB: u64 = 200;

/// Host memory of idle microVMs.
#[derive(Debug, Default, Serialize)]
pub struct VmDensity {
    pub vms: usize,
    pub rss_mib_per_vm: f64,
    pub pss_mib_per_vm: f64,
    /// PSS per VM of the guest's RAM mapping, of TCG's translation cache, of the rest.
    pub pss_guest_mib_per_vm: f64,
    pub pss_tcg_mib_per_vm: f64,
    pub pss_qemu_mib_per_vm: f64,
    pub cgroup_mib_per_vm: f64,
    pub mem_available_drop_mib_per_vm: f64,
    /// 20 GiB / PSS per VM.
    pub fit_in_20_gib: u64,
    pub qemu_left_after_delete: usize,
}

/// A daemon of this run (stopped when it drops; the run deletes its sandboxes before).
struct Node {
    daemon: Daemon,
    client: Client,
}

async fn start_node(
    root: &Path,
    name: &str,
    vm_dir: &Path,
    templates: bool,
) -> anyhow::Result<Node> {
    let daemon = Daemon::new(&root.join(name), name)?;
    let client = daemon.client(warren_client::DEFAULT_MAX_CONNECTIONS)?;
    let mut node = Node { daemon, client };
    let flags = |cmd: &mut std::process::Command| {
        cmd.arg("--vm-dir")
            .arg(vm_dir)
            .arg("--vm-templates")
            .arg(templates.to_string());
    };
    node.daemon
        .start(flags, &node.client, Duration::from_secs(30))
        .await?;
    let h = node.client.health().await?;
    if !h.substrates.iter().any(|s| s == "microvm") {
        bail!(
            "the daemon does not serve microvm (no QEMU or guest kernel?): see {}",
            node.daemon.dir().join("warrend.log").display()
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
    warren_runtime::procfs::MemInfo::read().map_or(0, |m| m.available_kib)
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
            "PSS per idle 256 MiB microVM",
            d.pss_mib_per_vm,
            "MiB",
            48.0,
        ));
        checks.push(Check::at_most(
            "QEMU left after delete",
            d.qemu_left_after_delete as f64,
            "",
            0.0,
        ));
    }
    if let Some(p) = &bench.pause {
        checks.push(Check::at_least(
            "share of 200 MiB written out of the cgroup at pause",
            p.out_of_cgroup_share * 100.0,
            "%",
            80.0,
        ));
        if let Some(l) = &p.pause_ms {
            checks.push(Check::at_most("pause p50", l.p50_ms / 1e3, "s", 2.0));
        }
    }
    if let Some(f) = bench.fork8_ms {
        checks.push(Check::at_most("fork -n 8 of a microVM", f / 1e3, "s", 2.0));
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
        (
            "pause (guest wrote 200 MiB)",
            &bench.pause.as_ref().and_then(|p| p.pause_ms.clone()),
        ),
        (
            "resume → first exec",
            &bench
                .pause
                .as_ref()
                .and_then(|p| p.resume_first_exec.clone()),
        ),
        ("fork child → first exec", &bench.fork_child_first_exec),
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
        let _ = writeln!(
            out,
            "PSS per VM: guest RAM {:.1} MiB, TCG translation cache {:.1} MiB, QEMU's own {:.1} MiB",
            d.pss_guest_mib_per_vm, d.pss_tcg_mib_per_vm, d.pss_qemu_mib_per_vm
        );
    }
    if let Some(f) = bench.fork8_ms {
        let _ = writeln!(out, "fork -n 8 of an idle microVM: {f:.0} ms");
    }
    if let Some(p) = &bench.pause {
        let _ = writeln!(
            out,
            "pause after the guest wrote {PAUSE_TOUCH_MIB} MiB: cgroup {:.1} -> {:.1} MiB ({:.0} % of it out), QEMU PSS {:.1} -> {:.1} MiB, zram took {:.1} MiB (compressed)",
            p.cgroup_before_mib,
            p.cgroup_after_mib,
            p.out_of_cgroup_share * 100.0,
            p.pss_before_mib,
            p.pss_after_mib,
            p.zram_growth_mib
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
        let mut parts = warren_runtime::vm::memory::PssBreakdown::default();
        let mut pids = Vec::new();
        for id in &ids {
            if let Some(pid) = qemu_pid(id) {
                rss += smaps_kib(pid, "Rss:");
                pss += smaps_kib(pid, "Pss:");
                if let Ok(b) = warren_runtime::vm::memory::pss_breakdown(pid, MEMORY_MB) {
                    parts.guest_kib += b.guest_kib;
                    parts.tcg_kib += b.tcg_kib;
                    parts.qemu_kib += b.qemu_kib;
                }
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
            pss_guest_mib_per_vm: parts.guest_kib as f64 / 1024.0 / k,
            pss_tcg_mib_per_vm: parts.tcg_kib as f64 / 1024.0 / k,
            pss_qemu_mib_per_vm: parts.qemu_kib as f64 / 1024.0 / k,
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
    note("pause and resume of a microVM that wrote 200 MiB");
    bench.pause = Some(pause(&warm.client, image).await?);
    note("fork -n 8 of a microVM");
    fork8(&warm.client, image, &mut bench).await?;
    drop((cold, warm));
    Ok(bench)
}

async fn fork8(c: &Client, image: &str, bench: &mut VmBench) -> anyhow::Result<()> {
    let (_, id) = create_exec(c, &request(image, 1024)).await?;
    let t = Instant::now();
    let kids = c
        .fork(
            &id,
            &warren_client::ForkRequest {
                n: 8,
                labels: Default::default(),
            },
        )
        .await;
    let elapsed = t.elapsed().as_secs_f64() * 1e3;
    let mut ids = vec![id];
    let mut firsts = Vec::new();
    if let Ok(kids) = &kids {
        bench.fork8_ms = Some(elapsed);
        for k in kids {
            let t = Instant::now();
            let r = c.exec(&k.id, &ExecRequest::argv(["true"])).await;
            firsts.push(t.elapsed().as_secs_f64() * 1e3);
            ids.push(k.id.clone());
            anyhow::ensure!(
                r.is_ok_and(|r| r.success()),
                "`true` failed in a fork child"
            );
        }
        bench.fork_child_first_exec = Some(Latency::from_samples(firsts));
    }
    for id in &ids {
        c.delete(id).await?;
    }
    kids.context("fork -n 8")?;
    Ok(())
}

/// zram's compressed bytes (`mm_stat`'s second field), 0 without zram.
fn zram_compressed_bytes() -> u64 {
    std::fs::read_to_string("/sys/block/zram0/mm_stat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn pause(c: &Client, image: &str) -> anyhow::Result<VmPause> {
    let cycles = 5;
    let (_, id) = create_exec(c, &request(image, 1024)).await?;
    let result = async {
        let touch = format!(
            "head -c {}M /dev/urandom > /root/data && sync",
            PAUSE_TOUCH_MIB
        );
        let r = c.exec(&id, &ExecRequest::shell(&touch)).await?;
        anyhow::ensure!(r.success(), "writing 200 MiB in the guest failed");
        let pid = qemu_pid(&id).context("QEMU of the pause sandbox")?;
        let mut out = VmPause {
            cycles,
            pss_before_mib: smaps_kib(pid, "Pss:") as f64 / 1024.0,
            ..Default::default()
        };
        let (mut pause_ms, mut resume_ms) = (Vec::new(), Vec::new());
        for i in 0..cycles {
            let z0 = zram_compressed_bytes();
            let st = c.pause(&id).await.context("pause")?;
            if i == 0 {
                out.pss_after_mib = smaps_kib(pid, "Pss:") as f64 / 1024.0;
                out.zram_growth_mib = zram_compressed_bytes().saturating_sub(z0) as f64 / 1048576.0;
                out.cgroup_before_mib = st.memory_before_bytes as f64 / 1048576.0;
                out.cgroup_after_mib = st.memory_after_bytes as f64 / 1048576.0;
                out.out_of_cgroup_share = ((out.cgroup_before_mib - out.cgroup_after_mib)
                    / PAUSE_TOUCH_MIB as f64)
                    .min(1.0);
            }
            pause_ms.push(st.duration_ms);
            let t = Instant::now();
            c.resume(&id).await.context("resume")?;
            let r = c.exec(&id, &ExecRequest::argv(["true"])).await?;
            anyhow::ensure!(r.success(), "`true` failed after resume");
            resume_ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        out.pause_ms = Some(Latency::from_samples(pause_ms));
        out.resume_first_exec = Some(Latency::from_samples(resume_ms));
        Ok(out)
    }
    .await;
    c.delete(&id).await?;
    result
}
