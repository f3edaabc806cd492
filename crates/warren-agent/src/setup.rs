//! Building a container sandbox from inside: namespaces, PID 1, root filesystem, hardening.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use warren_proto::{ContainerInit, Frame, Init, InitReply};
use warren_sys::mount::{mount, Flags};

use crate::error::{AgentError, Result as R};

/// Runs the whole start-up. Returns only in PID 1 of the new sandbox; the first stage exits.
pub fn container(ctl: &mut UnixStream, cfg: &ContainerInit) -> R<()> {
    // The namespaces' owner: the kernel charges what the sandbox makes (inotify instances and
    // watches, ...) to this uid in the host's namespace, so each sandbox has counts of its own.
    if let Some(uid) = cfg.owner_uid {
        warren_sys::caps::become_owner(uid, uid)?;
    }
    warren_sys::ns::unshare(warren_sys::ns::container_namespaces())?;
    set_user_limits(&cfg.user_limits)?;
    crate::wire::send_init(
        ctl,
        &InitReply::Unshared {
            pid: std::process::id(),
        },
    );
    // The layers, idmapped to this sandbox's range by the daemon once it wrote the maps.
    let trees = if cfg.layer_trees {
        let t = warren_sys::fd::recv_fds(ctl)?;
        if t.len() != cfg.lowerdirs.len() {
            return Err(AgentError::Protocol(format!(
                "{} layer mounts for {} layers",
                t.len(),
                cfg.lowerdirs.len()
            )));
        }
        Some(t)
    } else {
        None
    };
    // The commands' leaf group (kept across the fork below: PID 1 starts the commands).
    if cfg.command_groups > 0 {
        let g = warren_sys::fd::recv_fds(ctl)?;
        if g.len() != usize::from(cfg.command_groups) {
            return Err(AgentError::Protocol(format!(
                "{} command groups, {} announced",
                g.len(),
                cfg.command_groups
            )));
        }
        crate::exec::set_command_groups(g);
    }
    match Frame::read_blocking(ctl)
        .map_err(AgentError::frame("waiting for id maps"))?
        .parse::<Init>()
    {
        Ok(Init::Mapped) => {}
        other => {
            return Err(AgentError::Protocol(format!(
                "expected id maps, got {other:?}"
            )))
        }
    }
    warren_sys::process::become_user(0, 0)?;

    let (release_r, release_w) =
        std::os::unix::net::UnixStream::pair().map_err(AgentError::io("pipe"))?;
    match warren_sys::process::fork_checked()? {
        warren_sys::process::Forked::Parent { child } => {
            crate::wire::send_init(ctl, &InitReply::Child { pid: child });
            drop(release_w);
            std::process::exit(0);
        }
        warren_sys::process::Forked::Child => {
            drop(release_w);
            // Wait until the first stage has reported our pid (it closes its end then exits).
            let mut b = [0u8; 1];
            let _ = (&release_r).read(&mut b);
        }
    }
    build_root(cfg, trees.as_deref())?;
    harden(cfg)?;
    Ok(())
}

/// Writes the limits of the sandbox's own user namespace (`/proc/sys/user/<name>` shows and
/// sets the counts of the opener's namespace; the agent holds every capability in it now).
fn set_user_limits(limits: &[warren_proto::UserLimit]) -> R<()> {
    for l in limits {
        if l.name.contains('/') || l.name.starts_with('.') {
            return Err(AgentError::Protocol(format!("bad user limit {:?}", l.name)));
        }
        let path = format!("/proc/sys/user/{}", l.name);
        std::fs::write(&path, l.value.to_string())
            .map_err(AgentError::io(format!("write {path}")))?;
    }
    Ok(())
}

fn build_root(cfg: &ContainerInit, trees: Option<&[std::os::fd::OwnedFd]>) -> R<()> {
    if cfg.function.is_some() {
        let t = private_stage()?;
        let root = agent_root(cfg, &t, trees)?;
        enter(&root)?;
    } else {
        // On disk, the sandbox's own directory of the node's writable-layer file system is the
        // staging directory (no tmpfs at all); in memory, a tmpfs mounted on the staging
        // directory is.
        let t = match &cfg.writable_dir {
            Some(dir) => {
                make_private()?;
                PathBuf::from(dir)
            }
            None => private_stage()?,
        };
        let root = stage_root(
            cfg,
            &Layers::new(&cfg.lowerdirs, trees),
            &t,
            EtcFiles::Write,
        )?;
        keep_upper_handle(&t.join("upper"))?;
        enter(&root)?;
    }
    warren_sys::ns::set_hostname(&cfg.hostname)?;
    warren_sys::net::loopback_up()?;
    Ok(())
}

/// Makes every mount private, stages a cell's root from its layers at `CELL_DIR` (the top
/// layer is the agent's `ETC_LAYER`, see `cell_config`), enters it and sets the hostname: what a
/// cell and the Python zygote (which runs on a view of a cell's root) both start with.
pub fn enter_cell_root(cfg: &ContainerInit) -> R<()> {
    make_private()?;
    let root = stage_root(
        cfg,
        &Layers::paths(&cfg.lowerdirs),
        Path::new(CELL_DIR),
        EtcFiles::InLayer,
    )?;
    enter(&root)?;
    warren_sys::ns::set_hostname(&cfg.hostname)?;
    Ok(())
}

/// Makes every mount private to this mount namespace.
fn make_private() -> R<()> {
    mount(
        None,
        Path::new("/"),
        None,
        Flags::MS_REC | Flags::MS_PRIVATE,
        None,
    )?;
    Ok(())
}

/// Makes every mount private to this mount namespace and returns the staging directory.
pub fn private_stage() -> R<PathBuf> {
    make_private()?;
    // The staging directory is private to this mount namespace: a tmpfs holding the writable
    // layer (its size is the disk limit) and the merged root.
    let stage = PathBuf::from("/tmp");
    let stage = if Path::new("/run").is_dir() {
        PathBuf::from("/run")
    } else {
        stage
    };
    let t = stage.join("warren-sandbox");
    std::fs::create_dir_all(&t)
        .or_else(|_| {
            mount(
                Some("tmpfs"),
                &stage,
                Some("tmpfs"),
                Flags::empty(),
                Some("size=64k"),
            )
            .map_err(|x| x.source)
            .and_then(|_| std::fs::create_dir_all(&t))
        })
        .map_err(AgentError::io("staging dir"))?;
    Ok(t)
}

/// Where, in the staging directory, the sandbox's `/dev` lives (a directory of the writable
/// layer's tmpfs, bind-mounted; `/dev/shm` is a directory in it).
const DEV_DIR: &str = "dev";
/// An empty directory of the staging tmpfs that every masked directory (and a missing sysfs)
/// shows through a read-only bind mount. Nothing the sandbox can write reaches it: it is outside
/// `upper`, `root` and `dev`, and after `pivot_root` only its read-only binds are in the tree.
const EMPTY_DIR: &str = "empty";

/// The read-only layers of a root, topmost first: paths, or detached mounts to attach.
pub struct Layers<'a> {
    paths: &'a [String],
    trees: Option<&'a [std::os::fd::OwnedFd]>,
}

impl<'a> Layers<'a> {
    /// `trees`, when given, holds one mount per path (the paths then only name them).
    pub fn new(paths: &'a [String], trees: Option<&'a [std::os::fd::OwnedFd]>) -> Self {
        Layers { paths, trees }
    }

    /// Host paths (bound or linked).
    pub fn paths(paths: &'a [String]) -> Self {
        Layers { paths, trees: None }
    }

    fn len(&self) -> usize {
        self.paths.len()
    }

    /// Puts layer `i` at the new directory `at`: attaches its mount, or binds its path
    /// (`bind`) or links to it.
    fn place(&self, i: usize, at: &Path, bind: bool) -> R<()> {
        if let Some(t) = self.trees {
            std::fs::create_dir(at).map_err(AgentError::io("layer mount point"))?;
            warren_sys::mount::attach_tree(&t[i], at)?;
        } else if bind {
            std::fs::create_dir_all(at).map_err(AgentError::io("layer mount point"))?;
            mount(
                Some(&self.paths[i]),
                at,
                None,
                Flags::MS_BIND | Flags::MS_REC,
                None,
            )?;
        } else {
            std::os::unix::fs::symlink(&self.paths[i], at).map_err(AgentError::io("layer link"))?;
        }
        Ok(())
    }
}

/// Whether [`stage_root`] writes the root's `/etc/hostname`, `/etc/hosts` and
/// `/etc/resolv.conf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcFiles {
    /// Into the writable layer.
    Write,
    /// Not at all: the top layer of `lowerdirs` already holds them (a call environment's
    /// [`ETC_LAYER`]).
    InLayer,
}

/// Builds a sandbox root in `t`: a writable layer over `lowerdirs`, with /proc, /dev, /sys,
/// masks and /etc basics. Returns the merged root. The writable layer is a tmpfs mounted on
/// `t` (its size is the disk limit), or, with [`ContainerInit::writable_dir`], `t` itself: a
/// directory of the node's writable-layer file system that its quota holds to the limit.
///
/// Every superblock mounted here costs the kernel a shrinker, and each memory cgroup's shrinker
/// table grows with the number of shrinkers on the host (see docs/density.md): so /dev,
/// /dev/shm and every mask are directories of the one writable tmpfs, bind-mounted, /sys is
/// the node's one shared read-only sysfs, devpts is mounted only when asked for (or by the
/// daemon at the first terminal), and the sandbox owns only the overlay, proc (mqueue is the
/// superblock its IPC namespace has anyway) and, in memory, the tmpfs.
pub fn stage_root(
    cfg: &ContainerInit,
    lowerdirs: &Layers<'_>,
    t: &Path,
    etc: EtcFiles,
) -> R<PathBuf> {
    if cfg.writable_dir.is_none() {
        mount(
            Some("tmpfs"),
            t,
            Some("tmpfs"),
            Flags::MS_NOSUID | Flags::MS_NODEV,
            Some(&format!("size={}m,mode=755", cfg.disk_mb)),
        )?;
    }
    for d in ["upper", "work", "root", DEV_DIR, EMPTY_DIR] {
        std::fs::create_dir(t.join(d)).map_err(AgentError::io("mkdir in writable layer"))?;
    }
    set_mode(&t.join(EMPTY_DIR), 0o555)?;
    let root = t.join("root");
    // The overlay's options are shown in the sandbox's /proc/mounts as given: name every
    // layer by a relative name in the staging directory (a link to its host path, or the
    // mount point its tree is attached at), so no host path appears there.
    let mut lower = Vec::with_capacity(lowerdirs.len());
    for i in 0..lowerdirs.len() {
        let name = format!("l{i}");
        lowerdirs.place(i, &t.join(&name), false)?;
        lower.push(name);
    }
    let opts = format!(
        "lowerdir={},upperdir=upper,workdir=work,userxattr",
        lower.join(":")
    );
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    std::env::set_current_dir(t).map_err(AgentError::io("enter the staging directory"))?;
    let mounted = mount(
        Some("overlay"),
        &root,
        Some("overlay"),
        Flags::MS_NODEV,
        Some(&opts),
    );
    let _ = std::env::set_current_dir(&cwd);
    mounted?;

    let nosuid = Flags::MS_NOSUID | Flags::MS_NODEV | Flags::MS_NOEXEC;
    let mk = |p: &str| {
        let d = root.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(&d)
            .map(|_| d)
            .map_err(AgentError::io(format!("mkdir {p}")))
    };
    mount(Some("proc"), &mk("/proc")?, Some("proc"), nosuid, None)?;
    // /dev: nodev too (the device nodes are bind mounts of their own, which keep working),
    // and it counts against the disk limit like every file of the writable layer.
    let dev = mk("/dev")?;
    bind(&t.join(DEV_DIR), &dev, nosuid)?;
    bind_devices(&dev)?;
    let pts = mk("/dev/pts")?;
    if cfg.devpts {
        mount(
            Some("devpts"),
            &pts,
            Some("devpts"),
            Flags::MS_NOSUID | Flags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        )?;
    }
    // Dangling until a devpts is mounted (at start, or by the daemon at the first terminal).
    std::os::unix::fs::symlink("pts/ptmx", dev.join("ptmx")).map_err(AgentError::io("ptmx"))?;
    set_mode(&mk("/dev/shm")?, 0o1777)?;
    // The IPC namespace made its mqueue superblock when it was created: mounting it shows
    // that one (fs/mqueue.c keys the superblock by namespace) and adds none.
    let _ = mount(
        Some("mqueue"),
        &mk("/dev/mqueue")?,
        Some("mqueue"),
        nosuid,
        None,
    );
    for (l, t) in [
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
    ] {
        let _ = std::os::unix::fs::symlink(l, dev.join(t));
    }
    let empty = t.join(EMPTY_DIR);
    mount_sys(&mk("/sys")?, cfg.sysfs.as_deref(), &empty)?;
    for p in &cfg.masked_paths {
        mask(&root, p, &empty)?;
    }
    for p in &cfg.readonly_paths {
        let d = root.join(p.trim_start_matches('/'));
        if d.exists() {
            let _ = mount(
                Some(&d.to_string_lossy()),
                &d,
                None,
                Flags::MS_BIND | Flags::MS_REC,
                None,
            );
            let _ = mount(
                None,
                &d,
                None,
                Flags::MS_BIND | Flags::MS_REMOUNT | Flags::MS_RDONLY | nosuid,
                None,
            );
        }
    }
    if etc == EtcFiles::Write {
        write_etc(&root, &cfg.hostname, cfg.resolv_conf.as_deref());
    }
    Ok(root)
}

fn set_mode(p: &Path, mode: u32) -> R<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .map_err(AgentError::io(format!("chmod {}", p.display())))
}

/// Bind-mounts the directory `from` at `to` with exactly the mount flags `flags` (plus
/// `MS_RDONLY` if given). A bind that cannot be given its flags is taken away again and fails:
/// a mask must never be left writable.
fn bind(from: &Path, to: &Path, flags: Flags) -> R<()> {
    mount(
        Some(&from.to_string_lossy()),
        to,
        None,
        Flags::MS_BIND,
        None,
    )?;
    if let Err(e) = mount(
        None,
        to,
        None,
        Flags::MS_BIND | Flags::MS_REMOUNT | flags,
        None,
    ) {
        let _ = warren_sys::mount::umount(to, true);
        return Err(e.into());
    }
    Ok(())
}

/// Binds the harmless device nodes of the current /dev into `dev`.
pub fn bind_devices(dev: &Path) -> R<()> {
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let target = dev.join(node);
        std::fs::File::create(&target).map_err(AgentError::io("create device node"))?;
        mount(
            Some(&format!("/dev/{node}")),
            &target,
            None,
            Flags::MS_BIND,
            None,
        )?;
    }
    Ok(())
}

/// The node's shared read-only sysfs (`shared`, see [`ContainerInit::sysfs`]) bound
/// read-only, else a read-only sysfs of this network namespace, else `empty` bound read-only.
pub fn mount_sys(sys: &Path, shared: Option<&str>, empty: &Path) -> R<()> {
    let nosuid = Flags::MS_NOSUID | Flags::MS_NODEV | Flags::MS_NOEXEC;
    if let Some(s) = shared {
        // Only a sysfs is shown there: a path that holds anything else is refused, so a
        // wrong configuration cannot put a host directory into the sandbox.
        let is_sysfs = warren_sys::mount::holds_fs(Path::new(s), warren_sys::mount::SYSFS_MAGIC);
        if is_sysfs && bind(Path::new(s), sys, nosuid | Flags::MS_RDONLY).is_ok() {
            return Ok(());
        }
    }
    if mount(
        Some("sysfs"),
        sys,
        Some("sysfs"),
        nosuid | Flags::MS_RDONLY,
        None,
    )
    .is_err()
    {
        // Without a sysfs of our own, show an empty read-only directory rather than the host's.
        bind(empty, sys, nosuid | Flags::MS_RDONLY)?;
    }
    Ok(())
}

/// Enters a running sandbox's user and mount namespaces and mounts its own devpts on its
/// `/dev/pts`, unless one is there already. Only for a single-threaded helper process (see
/// `warren-agent devpts`): `setns` into a user namespace needs one. `/dev/pts` is opened
/// without following symbolic links and the mount goes onto that handle, so whatever the
/// sandbox did to its `/dev` the devpts lands in the sandbox's own tree or nowhere.
pub fn mount_devpts_in(user: &std::os::fd::OwnedFd, mnt: &std::os::fd::OwnedFd) -> R<()> {
    use warren_sys::ns::{setns, Namespaces};
    setns(user, Namespaces::CLONE_NEWUSER)?;
    // Entering a mount namespace also moves root and working directory to its root.
    setns(mnt, Namespaces::CLONE_NEWNS)?;
    let pts = warren_sys::mount::open_dir_nofollow(Path::new("/dev/pts"))?;
    if warren_sys::mount::fs_magic(&pts)? == warren_sys::mount::DEVPTS_MAGIC {
        return Ok(());
    }
    warren_sys::mount::mount_devpts_on(&pts)?;
    Ok(())
}

/// Makes `root` the root of this mount namespace and drops the old one.
pub fn enter(root: &Path) -> R<()> {
    std::env::set_current_dir(root).map_err(AgentError::io("chdir new root"))?;
    warren_sys::mount::pivot_root(Path::new("."), Path::new("."))?;
    warren_sys::mount::umount(Path::new("."), true)?;
    std::env::set_current_dir("/").map_err(AgentError::io("chdir /"))?;
    Ok(())
}

/// Keeps an `O_PATH` handle on the upper directory at [`warren_proto::UPPER_FD`]: after
/// `pivot_root` nothing in the sandbox can name it, but the daemon can take the handle with
/// `pidfd_getfd` to snapshot the writable layer (fork).
fn keep_upper_handle(upper: &Path) -> R<()> {
    use nix::fcntl::OFlag;
    let fd = nix::fcntl::open(
        upper,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|x| warren_sys::SysError::errno("open upper dir", x))?;
    let owned = warren_sys::fd::inherited(fd)?;
    warren_sys::fd::dup_to(&owned, warren_proto::UPPER_FD)?;
    drop(owned);
    let kept = warren_sys::fd::inherited(warren_proto::UPPER_FD)?;
    warren_sys::fd::set_cloexec(&kept, true)?;
    std::mem::forget(kept);
    Ok(())
}

/// Hides a kernel interface: a file gets /dev/null bound over it, a directory the empty
/// directory `empty` bound read-only (no superblock of its own).
fn mask(root: &Path, p: &str, empty: &Path) -> R<()> {
    let d = root.join(p.trim_start_matches('/'));
    match std::fs::symlink_metadata(&d) {
        Ok(m) if m.is_dir() => bind(
            empty,
            &d,
            Flags::MS_RDONLY | Flags::MS_NOSUID | Flags::MS_NODEV | Flags::MS_NOEXEC,
        ),
        Ok(_) => {
            let _ = mount(Some("/dev/null"), &d, None, Flags::MS_BIND, None);
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

fn write_etc(root: &Path, hostname: &str, resolv_conf: Option<&str>) {
    let etc = root.join("etc");
    let _ = std::fs::create_dir_all(&etc);
    let _ = std::fs::write(etc.join("hostname"), format!("{hostname}\n"));
    let _ = std::fs::write(
        etc.join("hosts"),
        format!("127.0.0.1\tlocalhost\n::1\tlocalhost\n127.0.1.1\t{hostname}\n"),
    );
    let resolv = etc.join("resolv.conf");
    if std::fs::symlink_metadata(&resolv)
        .map(|m| m.file_type().is_symlink())
        .unwrap_or(false)
    {
        let _ = std::fs::remove_file(&resolv);
    }
    let _ = std::fs::write(resolv, resolv_conf.unwrap_or("# no network by default\n"));
}

fn harden(cfg: &ContainerInit) -> R<()> {
    // A function container's agent keeps its capabilities (inside the sandbox's user
    // namespace) to build each call's namespaces and mounts; every call environment drops
    // them before running anything (see `cell`).
    if cfg.function.is_none() {
        warren_sys::caps::restrict_to(warren_sys::caps::DEFAULT_KEEP)?;
    }
    warren_sys::process::set_no_new_privs()?;
    // setresuid reset the dumpable flag to the system default: clear it again.
    warren_sys::process::set_non_dumpable()?;
    // A function container's agent still makes mounts for its calls (which Landlock
    // forbids): there each call environment enters the domain itself (see `cell`).
    if cfg.landlock && cfg.function.is_none() {
        // The agent enters the domain itself, so its file API and every command share it
        // (see warren_sys::landlock for what it enforces and why it is one domain).
        warren_sys::landlock::restrict_sandbox(Path::new("/"), Path::new("/dev"))?;
    }
    crate::exec::set_best_effort(cfg.best_effort);
    crate::exec::set_apparmor_profile(cfg.apparmor_profile.as_deref())?;
    Ok(())
}

/// Where the agent of a function container keeps the image layers (inside its own root,
/// which no command ever sees: commands only run in cells).
pub const LOWER_DIR: &str = "/lower";
/// Where a cell stages its writable layer and root (in its own mount namespace).
pub const CELL_DIR: &str = "/cell";
/// Where the agent of a function container keeps the `/etc/hostname`, `/etc/hosts` and
/// `/etc/resolv.conf` of its calls: a directory written once at start and the top read-only
/// layer of every cell's overlay, instead of three files (and the copy-up of `/etc`) written
/// into each cell's writable layer. A call that changes them changes its own copy.
pub const ETC_LAYER: &str = "/etc-layer";

/// The root of a function container's agent: a small tmpfs with the image layers bound at
/// `/lower/N`, the harmless device nodes, /proc and /sys (so cells may mount their own).
pub fn agent_root(
    cfg: &ContainerInit,
    t: &Path,
    trees: Option<&[std::os::fd::OwnedFd]>,
) -> R<PathBuf> {
    mount(
        Some("tmpfs"),
        t,
        Some("tmpfs"),
        Flags::MS_NOSUID | Flags::MS_NODEV,
        Some("size=1m,mode=755"),
    )?;
    let mk = |p: &str| {
        let d = t.join(p.trim_start_matches('/'));
        std::fs::create_dir_all(&d)
            .map(|_| d)
            .map_err(AgentError::io(format!("mkdir {p}")))
    };
    let layers = Layers::new(&cfg.lowerdirs, trees);
    mk(LOWER_DIR)?;
    for i in 0..layers.len() {
        layers.place(
            i,
            &t.join(LOWER_DIR.trim_start_matches('/'))
                .join(i.to_string()),
            true,
        )?;
    }
    mk(CELL_DIR)?;
    write_etc(&mk(ETC_LAYER)?, &cfg.hostname, cfg.resolv_conf.as_deref());
    let dev = mk("/dev")?;
    bind_devices(&dev)?;
    let nosuid = Flags::MS_NOSUID | Flags::MS_NODEV | Flags::MS_NOEXEC;
    mount(Some("proc"), &mk("/proc")?, Some("proc"), nosuid, None)?;
    let empty = mk(EMPTY_DIR)?;
    set_mode(&empty, 0o555)?;
    mount_sys(&mk("/sys")?, cfg.sysfs.as_deref(), &empty)?;
    Ok(t.to_path_buf())
}
