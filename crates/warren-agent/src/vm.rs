//! The agent as init of a VM guest (microvm and vm substrates).
//!
//! The kernel starts it as `/init` of an initramfs the daemon built (this executable, its
//! shared libraries and a few kernel modules). It loads the modules, finds its disks by their
//! virtio serial numbers, builds the root filesystem and switches to it, then serves the
//! protocol on the virtio-serial port named `warren`, whose host side is a socket of the VMM.
//!
//! Disks (serials): `layer-<i>` — read-only EROFS layers, `0` lowest (the node's image files,
//! shared by every VM); `rw` — the per-VM writable ext4 disk holding the overlay's upper
//! layer; or `root` — a whole-system ext4 disk used as the root as is (the `vm` substrate).
//! Kernel command line: `warren.disks=N` (how many to wait for), `warren.hostname=NAME`.
//!
//! The port survives the host side going away (daemon restart, snapshot restored in another
//! VMM): reads see end-of-file while nobody is connected, and the agent waits for the next
//! connection, which greets with `Init::Hello`. The agent must never exit: the kernel panics
//! when init does, which ends the VM.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use warren_proto::{Frame, InitReply, Kind, PROTOCOL_VERSION};
use warren_sys::mount::{mount, Flags};

use crate::error::{AgentError, Result as R};

/// The virtio-serial port's name (QEMU `virtserialport,name=`).
pub const PORT_NAME: &str = "warren";

/// How long the guest waits for its devices.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(30);

fn log(msg: &str) {
    // /dev/kmsg reaches the VM's console log, which the daemon keeps for failed starts
    // (at level 2: the console shows only levels below `loglevel=3`).
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open("/dev/kmsg") {
        // One write per record: /dev/kmsg makes a log line of every write.
        let _ = f.write_all(format!("<2>warren-agent: {msg}\n").as_bytes());
    }
}

/// Runs the guest: never returns.
pub fn main() -> ! {
    let port = match boot() {
        Ok(p) => p,
        Err(e) => {
            log(&format!("start-up failed: {e}"));
            // Without a port nobody can be told; a power-off ends the VM and the daemon
            // reports the console log.
            let _ = nix::sys::reboot::reboot(nix::sys::reboot::RebootMode::RB_POWER_OFF);
            std::process::exit(1)
        }
    };
    serve(port)
}

fn boot() -> R<PathBuf> {
    for (src, dir, fs) in [
        ("proc", "/proc", "proc"),
        ("sysfs", "/sys", "sysfs"),
        ("devtmpfs", "/dev", "devtmpfs"),
    ] {
        let _ = std::fs::create_dir_all(dir);
        mount(Some(src), Path::new(dir), Some(fs), Flags::empty(), None)?;
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let arg = |k: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(k).map(str::to_string))
    };
    let disks: usize = arg("warren.disks=")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let hostname = arg("warren.hostname=").unwrap_or_else(|| "sandbox".into());

    // No IPv6 on the interfaces made from here on (`eth0`, by the network driver below; the
    // loopback keeps `::1`): the sandbox's rules drop everything but IPv4, and bringing `eth0`
    // up would otherwise start IPv6's address configuration, duplicate address detection and
    // multicast reports in the guest kernel (under TCG the first run of each of those paths is
    // translated, after every restore).
    let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
    let order = std::fs::read_to_string("/modules.order").unwrap_or_default();
    for m in order.lines().filter(|l| !l.is_empty()) {
        warren_sys::guest::load_module(&Path::new("/modules").join(m))?;
    }

    let by_serial = wait_for_disks(disks)?;
    let port = wait_for_port()?;
    build_root(&by_serial)?;
    let _ = warren_sys::ns::set_hostname(&hostname);
    let _ = warren_sys::net::loopback_up();
    Ok(port)
}

/// Waits until `n` virtio disks exist; returns serial → device node.
fn wait_for_disks(n: usize) -> R<Vec<(String, PathBuf)>> {
    let start = Instant::now();
    loop {
        let mut found = Vec::new();
        if let Ok(rd) = std::fs::read_dir("/sys/block") {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.starts_with("vd") {
                    continue;
                }
                let serial = std::fs::read_to_string(e.path().join("serial")).unwrap_or_default();
                let dev = Path::new("/dev").join(&name);
                if dev.exists() {
                    found.push((serial.trim().to_string(), dev));
                }
            }
        }
        if found.len() >= n {
            return Ok(found);
        }
        if start.elapsed() > DEVICE_TIMEOUT {
            return Err(AgentError::Setup(format!(
                "found {} of {n} disks",
                found.len()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_for_port() -> R<PathBuf> {
    let start = Instant::now();
    loop {
        if let Ok(rd) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in rd.flatten() {
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                let dev = Path::new("/dev").join(e.file_name());
                if name.trim() == PORT_NAME && dev.exists() {
                    return Ok(dev);
                }
            }
        }
        if start.elapsed() > DEVICE_TIMEOUT {
            return Err(AgentError::Setup(format!(
                "no virtio-serial port named {PORT_NAME}"
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn mkdir(p: &str) -> R<()> {
    std::fs::create_dir_all(p).map_err(AgentError::io(format!("mkdir {p}")))
}

fn build_root(disks: &[(String, PathBuf)]) -> R<()> {
    let dev = |serial: &str| {
        disks
            .iter()
            .find(|(s, _)| s == serial)
            .map(|(_, d)| d.display().to_string())
    };
    let new_root = Path::new("/newroot");
    mkdir("/newroot")?;
    if let Some(root) = dev("root") {
        mount(Some(&root), new_root, Some("ext4"), Flags::empty(), None)?;
    } else {
        let mut layers: Vec<(usize, String)> = disks
            .iter()
            .filter_map(|(s, d)| {
                let i = s.strip_prefix("layer-")?.parse().ok()?;
                Some((i, d.display().to_string()))
            })
            .collect();
        layers.sort();
        if layers.is_empty() {
            return Err(AgentError::Setup("no image layers attached".into()));
        }
        let mut lower = Vec::new();
        for (i, d) in &layers {
            let dir = format!("/layers/{i}");
            mkdir(&dir)?;
            mount(
                Some(d),
                Path::new(&dir),
                Some("erofs"),
                Flags::MS_RDONLY,
                None,
            )?;
            lower.push(dir);
        }
        lower.reverse();
        let rw = dev("rw").ok_or_else(|| AgentError::Setup("no writable disk attached".into()))?;
        mkdir("/rw")?;
        mount(
            Some(&rw),
            Path::new("/rw"),
            Some("ext4"),
            Flags::empty(),
            None,
        )?;
        mkdir("/rw/upper")?;
        mkdir("/rw/work")?;
        let opts = format!(
            "lowerdir={},upperdir=/rw/upper,workdir=/rw/work",
            lower.join(":")
        );
        mount(
            Some("overlay"),
            new_root,
            Some("overlay"),
            Flags::empty(),
            Some(&opts),
        )?;
    }
    for d in ["proc", "sys", "dev", "tmp", "run"] {
        let _ = std::fs::create_dir_all(new_root.join(d));
    }
    for d in ["/proc", "/sys", "/dev"] {
        let target = new_root.join(&d[1..]);
        mount(Some(d), &target, None, Flags::MS_MOVE, None)?;
    }
    // Free the initramfs: its pages would otherwise stay in guest memory (and in every
    // snapshot). The running agent keeps what it has mapped.
    for p in ["/init", "/modules.order"] {
        let _ = std::fs::remove_file(p);
    }
    for d in ["/modules", "/lib", "/lib64", "/usr"] {
        let _ = std::fs::remove_dir_all(d);
    }
    warren_sys::guest::switch_root(new_root)?;
    let _ = std::fs::create_dir_all("/dev/pts");
    let _ = mount(
        Some("devpts"),
        Path::new("/dev/pts"),
        Some("devpts"),
        Flags::MS_NOSUID | Flags::MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    );
    let _ = std::fs::remove_file("/dev/ptmx");
    let _ = std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx");
    let _ = std::fs::create_dir_all("/dev/shm");
    let _ = mount(
        Some("shm"),
        Path::new("/dev/shm"),
        Some("tmpfs"),
        Flags::MS_NOSUID | Flags::MS_NODEV,
        Some("mode=1777"),
    );
    let _ = mount(
        Some("tmpfs"),
        Path::new("/run"),
        Some("tmpfs"),
        Flags::MS_NOSUID | Flags::MS_NODEV,
        Some("mode=755"),
    );
    Ok(())
}

/// The virtio-serial port as an async byte stream. End-of-file means "no host connected".
struct Port {
    fd: Rc<AsyncFd<OwnedFd>>,
}

impl AsyncRead for Port {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.as_raw_fd(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Port {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match guard.try_io(|fd| nix::unistd::write(fd, data).map_err(io::Error::from)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// True when a host is connected and has sent something (a daemon's first frame). While no
/// host is connected the port polls readable *and* hung up (reads return end-of-file).
fn host_sent_data(fd: &OwnedFd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    if !matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0) {
        return false;
    }
    fds[0]
        .revents()
        .is_some_and(|r| r.contains(PollFlags::POLLIN) && !r.contains(PollFlags::POLLHUP))
}

fn serve(port: PathBuf) -> ! {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let state = crate::serve::new_state();
        let fd: OwnedFd = loop {
            match nix::fcntl::open(
                &port,
                nix::fcntl::OFlag::O_RDWR
                    | nix::fcntl::OFlag::O_NONBLOCK
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            ) {
                // `open` returned a fresh descriptor that nothing else owns.
                Ok(raw) => break warren_sys::fd::inherited(raw).expect("port fd"),
                Err(e) => {
                    log(&format!("open {}: {e}", port.display()));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        // `AsyncFd::new` is deprecated for I/O-safety reasons that do not apply: we own the
        // port's fd and nothing else closes it while it is registered.
        #[allow(deprecated)]
        let fd = Rc::new(AsyncFd::new(fd).expect("port fd"));
        // The first connection gets an unasked Ready: the daemon that booted us waits for it.
        let mut first = Port { fd: fd.clone() };
        let ready = Frame::json(
            0,
            Kind::Init,
            &InitReply::Ready {
                version: PROTOCOL_VERSION,
            },
        );
        if let Err(e) = first.write_all(&ready.encode()).await {
            log(&format!("cannot greet the host: {e}"));
        }
        log("ready");
        loop {
            crate::serve::serve_conn(Port { fd: fd.clone() }, state.clone()).await;
            // Nobody is connected: wait (never spin: every pass of this loop allocates a
            // connection's tasks) for the next host connection's first bytes.
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                if host_sent_data(fd.get_ref()) {
                    break;
                }
            }
        }
    });
    std::process::exit(1)
}
