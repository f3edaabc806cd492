//! The VMM process: its command line and its start.
//!
//! Both substrates use a q35 machine with virtio-pci devices: Debian's guest kernels do not
//! discover the virtio-mmio devices of QEMU's `microvm` machine, and q35 boots as fast under
//! TCG. `microvm` strips q35 to what the guest needs (no default devices, no SATA, SMBus,
//! VGA, USB, network); `vm` keeps the standard q35 platform and boots from a whole-system disk.
//! The command line must be the same for the VMM that saves a snapshot and the one that
//! restores it (device ids, order, memory, CPUs): only host paths differ.

use std::path::{Path, PathBuf};
use warren_types::Substrate;

use super::memory::{Ram, BACKEND_ID};
use super::Accel;
use crate::RuntimeError;

/// TCG's translation cache, in MiB. QEMU's default (1 GiB) would be charged to the sandbox
/// as it fills; an idle guest uses a few MiB of it, a busy one flushes it more often.
pub const TB_SIZE_MB: u64 = 16;

/// One virtio-blk disk.
#[derive(Debug, Clone)]
pub struct Disk {
    /// The guest finds it by this serial (`layer-0`, `rw`, `root`).
    pub serial: String,
    pub file: PathBuf,
    pub format: &'static str,
    pub read_only: bool,
}

/// What differs between VMs of one machine shape.
pub struct Launch<'a> {
    pub substrate: Substrate,
    pub accel: Accel,
    pub memory_mb: u64,
    /// Where the guest's RAM lives.
    pub ram: &'a Ram,
    pub cpus: u32,
    pub kernel: &'a Path,
    pub initramfs: &'a Path,
    pub hostname: &'a str,
    pub disks: &'a [Disk],
    /// The sandbox's directory: sockets and logs.
    pub dir: &'a Path,
    /// Wait for `migrate-incoming` instead of booting.
    pub incoming: bool,
    /// A virtio-net interface on a tap ([`TAP_NAME`]) that QEMU makes in the network
    /// namespace of its own it is started in.
    pub nic: bool,
}

/// The tap of a VM with a network interface, inside QEMU's own network namespace.
pub const TAP_NAME: &str = "tap0";

/// The MAC on the command line: the same for every VM, since a restored guest keeps its
/// template's anyway; the guest agent gives each sandbox its own ([`sandbox_mac`]).
const TEMPLATE_MAC: &str = "02:57:52:00:00:01";

/// The network interface's arguments: a tap QEMU creates by name (in its own namespace: it
/// never sees the host's interfaces) and a virtio-net device on it, without option ROM (the
/// guest boots from `-kernel`).
pub fn nic_args() -> Vec<String> {
    vec![
        "-netdev".into(),
        format!("tap,id=net0,ifname={TAP_NAME},script=no,downscript=no"),
        "-device".into(),
        format!("virtio-net-pci,netdev=net0,id=nic0,mac={TEMPLATE_MAC},romfile="),
    ]
}

/// A sandbox's own MAC (locally administered, unicast), stable for its id.
pub fn sandbox_mac(id: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(id.as_bytes());
    format!(
        "02:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        h[0], h[1], h[2], h[3], h[4]
    )
}

pub fn qmp_socket(dir: &Path) -> PathBuf {
    dir.join("qmp.sock")
}

pub fn agent_socket(dir: &Path) -> PathBuf {
    dir.join("agent.sock")
}

pub fn console_log(dir: &Path) -> PathBuf {
    dir.join("console.log")
}

pub fn qemu_log(dir: &Path) -> PathBuf {
    dir.join("qemu.log")
}

pub fn args(l: &Launch<'_>) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    let machine = match l.substrate {
        Substrate::Vm => format!("q35,memory-backend={BACKEND_ID}"),
        _ => format!(
            "q35,smbus=off,sata=off,vmport=off,i8042=off,hpet=off,memory-backend={BACKEND_ID}"
        ),
    };
    let accel = match l.accel {
        Accel::Tcg => format!("tcg,tb-size={TB_SIZE_MB}"),
        Accel::Kvm => "kvm".to_string(),
    };
    let cpu = match l.accel {
        Accel::Kvm => "host",
        Accel::Tcg => "max",
    };
    push(&["-name", "warren", "-machine", &machine, "-accel", &accel]);
    push(&["-cpu", cpu, "-m", &l.memory_mb.to_string()]);
    a.extend(l.ram.args(l.memory_mb));
    let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
    push(&["-smp", &l.cpus.to_string()]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-no-reboot",
    ]);
    let console = console_log(l.dir);
    push(&["-serial", &format!("file:{}", console.display())]);
    push(&["-kernel", &l.kernel.display().to_string()]);
    push(&["-initrd", &l.initramfs.display().to_string()]);
    let cmdline = format!(
        "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check pci=noaer random.trust_cpu=on \
         init_on_free=1 \
         warren.disks={} warren.hostname={}",
        l.disks.len(),
        l.hostname
    );
    push(&["-append", &cmdline]);
    for (i, d) in l.disks.iter().enumerate() {
        let ro = if d.read_only { ",read-only=on" } else { "" };
        push(&[
            "-drive",
            &format!(
                "if=none,id=d{i},file={},format={}{ro},discard=unmap",
                d.file.display(),
                d.format
            ),
        ]);
        push(&[
            "-device",
            &format!("virtio-blk-pci,drive=d{i},id=vd{i},serial={}", d.serial),
        ]);
    }
    push(&["-device", "virtio-serial-pci,id=ser0,max_ports=2"]);
    push(&[
        "-chardev",
        &format!(
            "socket,id=agent,path={},server=on,wait=off",
            agent_socket(l.dir).display()
        ),
    ]);
    push(&[
        "-device",
        "virtserialport,bus=ser0.0,chardev=agent,name=warren,id=port0",
    ]);
    push(&[
        "-qmp",
        &format!("unix:{},server=on,wait=off", qmp_socket(l.dir).display()),
    ]);
    if l.nic {
        a.extend(nic_args());
    }
    if l.incoming {
        a.extend(["-incoming".to_string(), "defer".to_string()]);
    }
    a
}

/// Starts QEMU in its own session with /dev/null on stdin/stdout and its stderr in the
/// sandbox's directory (start-up errors are read from there). With a network interface it
/// starts in a new network namespace (`unshare --net`, which execs QEMU: same pid). Returns
/// its pid and its exit status to come (from the daemon's reaper).
///
/// QEMU runs without transparent huge pages: it asks for them on all guest RAM, and a restore
/// from a snapshot (fork children, `--snapshot` creates) reads the saved pages into it, so
/// each first write into a 2 MiB range had the kernel zero all of it and keep it resident,
/// however few pages the snapshot held there (a snapshot of an idle 512 MiB guest holds
/// 61 MiB: every child of a fork zeroed and kept ~512).
pub fn spawn(
    qemu: &Path,
    l: &Launch<'_>,
) -> Result<
    (
        u32,
        tokio::sync::oneshot::Receiver<crate::reaper::ChildExit>,
    ),
    RuntimeError,
> {
    use std::os::fd::AsRawFd;
    let devnull = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| RuntimeError::io("open /dev/null", e))?;
    let log = std::fs::File::create(qemu_log(l.dir))
        .map_err(|e| RuntimeError::io("create qemu.log", e))?;
    let mut prog = qemu.display().to_string();
    let mut argv = vec![prog.clone()];
    if l.nic {
        argv = vec![
            "unshare".into(),
            "--net".into(),
            "--".into(),
            qemu.display().to_string(),
        ];
        prog = unshare_path();
    }
    argv.extend(args(l));
    let spawned = crate::reaper::spawn_wait_with(
        &prog,
        &argv,
        &[
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            // One malloc arena per thread (glibc's default) costs each VMM megabytes.
            "MALLOC_ARENA_MAX=1".to_string(),
        ],
        &[
            (devnull.as_raw_fd(), 0),
            (devnull.as_raw_fd(), 1),
            (log.as_raw_fd(), 2),
        ],
        warren_sys::process::HugePages::Off,
    )?;
    Ok(spawned)
}

/// util-linux's `unshare`.
fn unshare_path() -> String {
    ["/usr/bin/unshare", "/bin/unshare", "/usr/sbin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("unshare")
        .to_string()
}

/// How the VMM ended, for the sandbox's failure reason: exit status or signal, and the last
/// lines of its log and the guest's console.
pub fn death_reason(pid: u32, exit: Option<crate::reaper::ChildExit>, dir: &Path) -> String {
    use crate::reaper::ChildExit;
    let how = match exit {
        Some(ChildExit::Code(c)) => format!("exited with status {c}"),
        Some(ChildExit::Signal(s)) => {
            let name = nix::sys::signal::Signal::try_from(s)
                .map(|n| n.as_str().to_string())
                .unwrap_or_else(|_| "unknown".into());
            format!("was killed by signal {s} ({name})")
        }
        None => "exited".into(),
    };
    format!("QEMU (pid {pid}) {how}{}", log_tail(dir))
}

/// The last lines of the VMM's and the guest's logs, for error messages.
pub fn log_tail(dir: &Path) -> String {
    let tail = |p: PathBuf| {
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(6)..].join(" | ")
    };
    let q = tail(qemu_log(dir));
    let c = tail(console_log(dir));
    match (q.is_empty(), c.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(" (qemu: {q})"),
        (true, false) => format!(" (guest: {c})"),
        (false, false) => format!(" (qemu: {q}; guest: {c})"),
    }
}

/// `qemu-system-x86_64 --version`, first line.
pub async fn version(qemu: &Path) -> Result<String, RuntimeError> {
    let out = super::tool::run(qemu, &["--version".to_string()])
        .await
        .map_err(|e| {
            RuntimeError::Unsupported(crate::Unsupported::QemuCannotRun {
                qemu: qemu.to_path_buf(),
                source: Box::new(e),
            })
        })?;
    Ok(out.lines().next().unwrap_or("").to_string())
}
