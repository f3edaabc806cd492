//! Creating a VM sandbox: boot (cold) or restore (from a snapshot), then the handshake with
//! the guest's agent over the virtio-serial socket.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use warren_proto::{Frame, Init, InitReply, Kind, PROTOCOL_VERSION};
use warren_types::Substrate;

use super::memory::{self, Ram};
use super::qemu::{self, Disk, Launch};
use super::record::{
    capabilities, MachineKey, Snapshot, VmRecord, RECORD_VERSION, TEMPLATE_HOSTNAME,
};
use super::{destroy, disk, qmp::Qmp, vcpus, Accel, Vm, VmRuntime, VMM_OVERHEAD_MB};
use crate::agent::AgentConn;
use crate::cgroup::CgroupSet;
use crate::procfs::start_time;
use crate::{RuntimeError, SandboxSpec, StartCause};

/// Longest a cold boot may take until the agent answers (TCG boots in ~4 s; a loaded
/// 2-core host running several at once needs much more).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a restore may take until the agent answers.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(60);
/// Where the probe's answer is kept (tmpfs: forgotten when the host reboots).
const ACCEL_CACHE: &str = "/run/warren/vm-accel.json";
/// How long a KVM probe boot may take before KVM is declared unusable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The disks of a sandbox, in attachment order: image layers (shared, read-only) and the
/// writable disk (microvm), or one system disk (vm).
fn disks(rt: &VmRuntime, layers: &[String], writable: &Path) -> Result<Vec<Disk>, RuntimeError> {
    let mut v = Vec::new();
    if rt.substrate == Substrate::Vm {
        v.push(Disk {
            serial: "root".into(),
            file: writable.to_path_buf(),
            format: "qcow2",
            read_only: false,
        });
        return Ok(v);
    }
    for (i, d) in layers.iter().enumerate() {
        v.push(Disk {
            serial: format!("layer-{i}"),
            file: rt.images.blob_path(d)?,
            format: "raw",
            read_only: true,
        });
    }
    v.push(Disk {
        serial: "rw".into(),
        file: writable.to_path_buf(),
        format: "qcow2",
        read_only: false,
    });
    Ok(v)
}

/// The base a fresh writable (or system) disk is an overlay of.
async fn fresh_base(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
) -> Result<PathBuf, RuntimeError> {
    let base = rt.cfg.root.join("base");
    if rt.substrate == Substrate::Vm {
        let blobs = layers
            .iter()
            .map(|d| rt.images.blob_path(d))
            .collect::<Result<Vec<_>, _>>()?;
        let key = {
            use sha2::{Digest, Sha256};
            hex::encode(Sha256::digest(layers.join(",").as_bytes()))[..16].to_string()
        };
        disk::system_image(&base, &blobs, &key, spec.limits.disk_mb).await
    } else {
        disk::empty_ext4(&base, spec.limits.disk_mb).await
    }
}

struct Started {
    pid: u32,
    qmp: Qmp,
    agent: UnixStream,
    exited: tokio::sync::watch::Receiver<bool>,
    death: Death,
}

/// How the VMM ended, once it has (see [`qemu::death_reason`]).
pub(super) type Death = std::sync::Arc<std::sync::OnceLock<String>>;

/// Starts QEMU in the sandbox's cgroups and connects to its QMP and agent sockets.
async fn start(
    rt: &VmRuntime,
    launch: &Launch<'_>,
    cgroups: &CgroupSet,
) -> Result<Started, RuntimeError> {
    let (pid, status) = qemu::spawn(&rt.cfg.qemu, launch)?;
    // From here on QEMU is owned by the sandbox's cgroups: killing them kills it.
    cgroups.add_pid(pid)?;
    let (exited, death) = watch_exit(pid, Some(status), launch.dir.to_path_buf())?;
    let qmp = Qmp::connect(&qemu::qmp_socket(launch.dir), Duration::from_secs(20))
        .await
        .map_err(|e| StartCause::Vmm {
            step: "connecting to QMP".into(),
            detail: format!("{e}{}", qemu::log_tail(launch.dir)),
        })?;
    let agent = connect(&qemu::agent_socket(launch.dir)).await?;
    Ok(Started {
        pid,
        qmp,
        agent,
        exited,
        death,
    })
}

/// A watch that turns true when `pid` exits (through a pidfd), and how it ended: set just
/// before the watch turns, from `status` (the reaper's word, when QEMU is this daemon's
/// child) and the logs in `dir`.
pub(super) fn watch_exit(
    pid: u32,
    status: Option<tokio::sync::oneshot::Receiver<crate::reaper::ChildExit>>,
    dir: PathBuf,
) -> Result<(tokio::sync::watch::Receiver<bool>, Death), RuntimeError> {
    let pidfd = warren_sys::pidfd::open(pid)?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    let death = Death::default();
    let set = death.clone();
    // `AsyncFd::new` is deprecated for I/O-safety reasons that do not apply: the pidfd is
    // owned here and closed only when the AsyncFd drops.
    #[allow(deprecated)]
    let afd = tokio::io::unix::AsyncFd::with_interest(pidfd, tokio::io::Interest::READABLE)
        .map_err(|e| RuntimeError::io("register pidfd", e))?;
    tokio::spawn(async move {
        tokio::select! {
            _ = afd.readable() => {
                // The pidfd turns readable at the exit; the reaper's status follows at once
                // (a daemon without the reaper never sends one).
                let exit = match status {
                    Some(rx) => tokio::time::timeout(Duration::from_secs(1), rx)
                        .await
                        .ok()
                        .and_then(Result::ok),
                    None => None,
                };
                let _ = set.set(qemu::death_reason(pid, exit, &dir));
                let _ = tx.send(true);
            }
            _ = tx.closed() => {}
        }
    });
    Ok((rx, death))
}

async fn connect(path: &Path) -> Result<UnixStream, RuntimeError> {
    let start = Instant::now();
    loop {
        match UnixStream::connect(path).await {
            Ok(s) => return Ok(s),
            Err(e) if start.elapsed() > Duration::from_secs(20) => {
                return Err(StartCause::AgentSocket {
                    path: path.to_path_buf(),
                    source: e,
                }
                .into())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// Waits for the agent's `Ready` (or QEMU's exit).
async fn wait_ready(
    s: &mut Started,
    dir: &Path,
    timeout: Duration,
    what: &str,
) -> Result<(), RuntimeError> {
    let mut exited = s.exited.clone();
    let death = s.death.clone();
    let read = async {
        loop {
            let f = Frame::read_async(&mut s.agent)
                .await
                .map_err(|e| StartCause::AgentIo {
                    step: what.to_string(),
                    source: e,
                    log: qemu::log_tail(dir),
                })?;
            if f.kind != Kind::Init {
                continue;
            }
            match f.parse::<InitReply>() {
                Ok(InitReply::Ready { .. }) => return Ok(()),
                Ok(InitReply::Failed { message }) => {
                    return Err(StartCause::AgentRefused { message }.into())
                }
                _ => continue,
            }
        }
    };
    tokio::select! {
        r = tokio::time::timeout(timeout, read) => r.map_err(|_| StartCause::AgentTimeout {
            step: format!("{what}, {timeout:?}"),
            log: qemu::log_tail(dir),
        })?,
        _ = exited.wait_for(|e| *e) => Err(StartCause::Vmm {
            step: what.to_string(),
            detail: death
                .get()
                .cloned()
                .unwrap_or_else(|| format!("QEMU exited{}", qemu::log_tail(dir))),
        }
        .into()),
    }
}

/// Makes the sandbox's directory and cgroups (memory limit = guest RAM + VMM overhead).
async fn prepare(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    dir: &Path,
) -> Result<CgroupSet, RuntimeError> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)
        .map_err(|e| RuntimeError::io(format!("create {}", dir.display()), e))?;
    std::fs::write(dir.join("substrate"), rt.substrate.as_str())
        .map_err(|e| RuntimeError::io("write substrate", e))?;
    let cgroups = rt.hierarchy.set_for(spec.id.as_str());
    let mut limits = spec.limits.clone();
    limits.memory_mb += VMM_OVERHEAD_MB;
    if let Err(e) = cgroups.create(&limits) {
        let _ = cgroups.remove().await;
        return Err(e);
    }
    Ok(cgroups)
}

async fn cleanup(cgroups: &CgroupSet, dir: &Path, id: &str) {
    if let Err(e) = destroy::destroy(cgroups, dir).await {
        tracing::error!(sandbox = id, error = %e, "cleanup after failed VM start");
    }
}

/// Cold boot. With `ram_file` the guest's RAM is the file `ram` of the sandbox's directory,
/// mapped shared (a template's VM: its snapshot then leaves the RAM out of the stream).
pub async fn boot(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
    dir: Option<&Path>,
    ram_file: bool,
) -> Result<Vm, RuntimeError> {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| rt.sandbox_dir(spec.id.as_str()));
    let accel = rt.accel().await;
    let ram = if ram_file {
        Ram::Shared(dir.join(memory::RAM_FILE))
    } else {
        Ram::Anonymous
    };
    boot_with(rt, spec, layers, &dir, accel, ram, BOOT_TIMEOUT)
        .await
        .map_err(RuntimeError::into_start_failure)
}

async fn boot_with(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
    dir: &Path,
    accel: Accel,
    ram: Ram,
    timeout: Duration,
) -> Result<Vm, RuntimeError> {
    let t0 = Instant::now();
    let cgroups = prepare(rt, spec, dir).await?;
    let t_cgroups = t0.elapsed();
    let mut t_image = Duration::ZERO;
    let result = async {
        let base = fresh_base(rt, spec, layers).await?;
        let writable = dir.join("disk.qcow2");
        disk::overlay(&rt.cfg.qemu_img, &base, "raw", &writable).await?;
        let disks = disks(rt, layers, &writable)?;
        t_image = t0.elapsed() - t_cgroups;
        let initramfs = rt.initramfs().await?;
        let launch = Launch {
            substrate: rt.substrate,
            accel,
            memory_mb: spec.limits.memory_mb,
            ram: &ram,
            cpus: vcpus(spec),
            kernel: &rt.cfg.kernel_dir.join("vmlinuz"),
            initramfs: &initramfs,
            hostname: &spec.hostname,
            disks: &disks,
            dir,
            incoming: false,
            nic: spec.network,
        };
        let mut s = start(rt, &launch, &cgroups).await?;
        wait_ready(&mut s, dir, timeout, "boot").await?;
        Ok::<Started, RuntimeError>(s)
    }
    .await;
    let s = match result {
        Ok(s) => s,
        Err(e) => {
            cleanup(&cgroups, dir, spec.id.as_str()).await;
            return Err(e);
        }
    };
    tracing::debug!(sandbox = %spec.id, ms = t0.elapsed().as_millis() as u64, accel = accel.as_str(), "VM booted");
    let key = match rt.key(spec, layers).await {
        Ok(k) => k,
        Err(e) => {
            cleanup(&cgroups, dir, spec.id.as_str()).await;
            return Err(e);
        }
    };
    let mut vm = finish(rt, spec, layers, dir, cgroups, s, key, ram, None);
    vm.phases = vec![
        ("cgroups", t_cgroups),
        ("image", t_image),
        ("agent", t0.elapsed().saturating_sub(t_cgroups + t_image)),
    ];
    Ok(vm)
}

#[allow(clippy::too_many_arguments)]
fn finish(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
    dir: &Path,
    cgroups: CgroupSet,
    s: Started,
    key: MachineKey,
    ram: Ram,
    template: Option<String>,
) -> Vm {
    let record = VmRecord {
        version: RECORD_VERSION,
        qemu_pid: s.pid,
        qemu_start_time: start_time(s.pid).unwrap_or(0),
        dir: dir.to_path_buf(),
        layers: layers.to_vec(),
        template,
    };
    Vm {
        id: spec.id.clone(),
        images: rt.images.clone(),
        agent: AgentConn::new(s.agent),
        qmp: s.qmp,
        cgroups,
        record,
        key,
        ram,
        paused: Default::default(),
        exited: s.exited,
        death: s.death,
        phases: Vec::new(),
    }
}

/// How a restored sandbox gets its writable disk from the snapshot's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFrom {
    /// A fresh overlay backed by the snapshot's disk (the snapshot must outlive the sandbox).
    Overlay,
    /// A copy of the snapshot's disk (the snapshot may be removed right after).
    Copy,
}

/// Restores a snapshot into a new sandbox: a new QEMU waits for the migration stream, its
/// writable disk is made from the snapshot's ([`DiskFrom`]).
pub async fn restore(
    rt: &VmRuntime,
    spec: &SandboxSpec,
    layers: &[String],
    snap: &Snapshot,
    disk_from: DiskFrom,
) -> Result<Vm, RuntimeError> {
    let key = rt.key(spec, layers).await?;
    if snap.meta.machine != key {
        return Err(StartCause::Snapshot(crate::SnapshotError::OtherMachine {
            dir: snap.dir.clone(),
            made_for: format!("{:?}", snap.meta.machine),
            this: format!("{key:?}"),
        })
        .into());
    }
    let t0 = Instant::now();
    let dir = rt.sandbox_dir(spec.id.as_str());
    // A template's RAM is its file, mapped copy-on-write: pages no guest writes stay one
    // copy in the page cache for every VM of the shape.
    let ram = if snap.meta.ram_file {
        Ram::Private(snap.ram())
    } else {
        Ram::Anonymous
    };
    let cgroups = prepare(rt, spec, &dir)
        .await
        .map_err(RuntimeError::into_start_failure)?;
    let mut marks = (Duration::ZERO, Duration::ZERO);
    let result = async {
        let t_prepared = t0.elapsed();
        let writable = dir.join("disk.qcow2");
        match disk_from {
            DiskFrom::Overlay => {
                disk::overlay(&rt.cfg.qemu_img, &snap.disk(), "qcow2", &writable).await?
            }
            DiskFrom::Copy => disk::copy(&snap.disk(), &writable).await?,
        }
        let disks = disks(rt, layers, &writable)?;
        let accel = rt.accel().await;
        let boot = rt.cfg.root.join("boot");
        let initramfs = super::initramfs::empty(&boot)?;
        let kernel = memory::stub_kernel(&rt.cfg.kernel_dir.join("vmlinuz"), &boot)?;
        let launch = Launch {
            substrate: rt.substrate,
            accel,
            memory_mb: spec.limits.memory_mb,
            ram: &ram,
            cpus: vcpus(spec),
            kernel: &kernel,
            initramfs: &initramfs,
            hostname: TEMPLATE_HOSTNAME,
            disks: &disks,
            dir: &dir,
            incoming: true,
            nic: spec.network,
        };
        let t_disk = t0.elapsed();
        marks = (t_prepared, t_disk);
        let mut s = start(rt, &launch, &cgroups).await?;
        let t_started = t0.elapsed();
        let incoming = async {
            s.qmp
                .set_capabilities(&capabilities(snap.meta.ram_file))
                .await?;
            s.qmp
                .migrate_incoming(&format!("file:{}", snap.memory().display()))
                .await?;
            s.qmp.wait_migration(RESTORE_TIMEOUT).await
        };
        incoming.await.map_err(|e| {
            StartCause::Snapshot(crate::SnapshotError::Restore {
                source: Box::new(e),
                log: qemu::log_tail(&dir),
            })
        })?;
        let t_migrated = t0.elapsed();
        if s.qmp.status().await? != "running" {
            s.qmp.cont().await?;
        }
        Frame::json(
            0,
            Kind::Init,
            &Init::Hello {
                version: PROTOCOL_VERSION,
                hostname: Some(spec.hostname.clone()),
            },
        )
        .write_async(&mut s.agent)
        .await
        .map_err(|e| StartCause::AgentIo {
            step: "greeting the restored agent".into(),
            source: e,
            log: String::new(),
        })?;
        wait_ready(&mut s, &dir, RESTORE_TIMEOUT, "restore").await?;
        tracing::debug!(
            sandbox = %spec.id,
            prepared_us = t_prepared.as_micros() as u64,
            disk_us = t_disk.as_micros() as u64,
            qemu_started_us = t_started.as_micros() as u64,
            migrated_us = t_migrated.as_micros() as u64,
            ready_us = t0.elapsed().as_micros() as u64,
            "VM restore phases"
        );
        Ok::<Started, RuntimeError>(s)
    }
    .await;
    let s = match result {
        Ok(s) => s,
        Err(e) => {
            cleanup(&cgroups, &dir, spec.id.as_str()).await;
            return Err(e.into_start_failure());
        }
    };
    tracing::debug!(sandbox = %spec.id, ms = t0.elapsed().as_millis() as u64, "VM restored");
    let mut vm = finish(
        rt,
        spec,
        layers,
        &dir,
        cgroups,
        s,
        key,
        ram,
        Some(snap.dir.display().to_string()),
    );
    // The agent's phase of a restore is the memory image's restore until the agent answers.
    vm.phases = vec![
        ("cgroups", marks.0),
        ("image", marks.1.saturating_sub(marks.0)),
        ("agent", t0.elapsed().saturating_sub(marks.1)),
    ];
    Ok(vm)
}

/// KVM if `/dev/kvm` opens *and* a guest boots with it; otherwise TCG, with a warning. The
/// answer is kept per QEMU and kernel version in `/run/warren/vm-accel.json` (a property of
/// the host until it reboots, shared by every daemon) so later starts skip the probe.
pub async fn probe_accel(rt: &VmRuntime) -> Accel {
    let cache = std::path::Path::new(ACCEL_CACHE);
    if let Some(dir) = cache.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let stamp = format!("{} / {}", rt.qemu_version().await, rt.kernel);
    if let Ok(s) = std::fs::read_to_string(cache) {
        if let Ok((st, a)) = serde_json::from_str::<(String, Accel)>(&s) {
            if st == stamp {
                return a;
            }
        }
    }
    let kvm_opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let accel = if !kvm_opens {
        tracing::warn!("/dev/kvm is not usable: VMs run under TCG (software emulation, slow)");
        Accel::Tcg
    } else {
        match probe_kvm(rt).await {
            Ok(()) => {
                tracing::info!("KVM boots guests: VMs use hardware virtualization");
                Accel::Kvm
            }
            Err(e) => {
                tracing::warn!(error = %e, "a guest does not boot under this host's KVM: VMs run under TCG (software emulation, slow)");
                Accel::Tcg
            }
        }
    };
    let _ = std::fs::write(
        cache,
        serde_json::to_string(&(stamp, accel)).unwrap_or_default(),
    );
    accel
}

async fn probe_kvm(rt: &VmRuntime) -> Result<(), RuntimeError> {
    let id = warren_types::SandboxId::generate(&rt.cfg.node);
    let spec = SandboxSpec {
        id,
        image: Vec::new(),
        limits: warren_types::Limits {
            memory_mb: 256,
            ..Default::default()
        },
        hostname: "probe".into(),
        labels: Default::default(),
        devpts: false,
        network: false,
        resolv_conf: None,
        on_netns: None,
    };
    // The probe boots the initramfs alone: the agent fails to find its disks, but reaching
    // the kernel's init proves the accelerator works. Without disks the agent powers off; we
    // look for its message on the console.
    let dir = rt.sandbox_dir(spec.id.as_str());
    let initramfs = rt.initramfs().await?;
    let cgroups = prepare(rt, &spec, &dir).await?;
    let launch = Launch {
        substrate: Substrate::Microvm,
        accel: Accel::Kvm,
        memory_mb: 256,
        ram: &Ram::Anonymous,
        cpus: 1,
        kernel: &rt.cfg.kernel_dir.join("vmlinuz"),
        initramfs: &initramfs,
        hostname: "probe",
        disks: &[],
        dir: &dir,
        incoming: false,
        nic: false,
    };
    let result = async {
        let (pid, _status) = qemu::spawn(&rt.cfg.qemu, &launch)?;
        cgroups.add_pid(pid)?;
        let start = Instant::now();
        loop {
            let console = std::fs::read_to_string(qemu::console_log(&dir)).unwrap_or_default();
            if console.contains("warren-agent") {
                return Ok(());
            }
            if start_time(pid).is_none() || start.elapsed() > PROBE_TIMEOUT {
                return Err(crate::VmmError::NoGuestInit {
                    log: qemu::log_tail(&dir),
                }
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    .await;
    cleanup(&cgroups, &dir, spec.id.as_str()).await;
    result
}
