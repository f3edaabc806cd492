//! Mounts: classic `mount(2)` wrappers plus the new mount API for idmapped mounts.

use crate::{Result, SysError};
use nix::mount::{MntFlags, MsFlags};
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

pub use nix::mount::MsFlags as Flags;

/// `mount(2)`. `data` is the filesystem's option string.
pub fn mount(
    source: Option<&str>,
    target: &Path,
    fstype: Option<&str>,
    flags: MsFlags,
    data: Option<&str>,
) -> Result<()> {
    nix::mount::mount(source, target, fstype, flags, data).map_err(|e| {
        SysError::errno(
            format!(
                "mount {} on {} ({})",
                source.unwrap_or("none"),
                target.display(),
                fstype.unwrap_or("-")
            ),
            e,
        )
    })
}

/// `umount2(2)` with `MNT_DETACH` when `lazy`.
pub fn umount(target: &Path, lazy: bool) -> Result<()> {
    let flags = if lazy {
        MntFlags::MNT_DETACH
    } else {
        MntFlags::empty()
    };
    nix::mount::umount2(target, flags)
        .map_err(|e| SysError::errno(format!("umount {}", target.display()), e))
}

/// `pivot_root(2)`.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> Result<()> {
    nix::unistd::pivot_root(new_root, put_old)
        .map_err(|e| SysError::errno(format!("pivot_root {}", new_root.display()), e))
}

/// Mounts a file-backed EROFS image read-only at `target` with a direct `mount(2)` (no loop
/// device; `mount(8)` would silently make one).
pub fn mount_erofs_file(image: &Path, target: &Path) -> Result<()> {
    let src = image
        .to_str()
        .ok_or_else(|| SysError::new("erofs image path", std::io::Error::other("not UTF-8")))?;
    mount(
        Some(src),
        target,
        Some("erofs"),
        MsFlags::MS_RDONLY | MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        None,
    )
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| SysError::new("path", std::io::Error::other("NUL in path")))
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Creates at `target` a read-only clone of the mount at `source` whose file ownership is
/// shifted through `userns`'s id maps (an idmapped mount). All sandboxes that share the same
/// id range can share this one mount.
pub fn idmapped_clone(source: &Path, userns: &OwnedFd, target: &Path) -> Result<()> {
    let tree = idmapped_tree(source, userns)?;
    attach_tree(&tree, target)
}

/// A detached, read-only clone of the mount at `source` whose file ownership is shifted
/// through `userns`'s id maps: an idmapped mount that belongs to no mount namespace until
/// [`attach_tree`] puts it somewhere (in any mount namespace whose owner may mount: a
/// sandbox's agent can attach a tree the host's root made for it). It shares the source's
/// superblock and page cache.
pub fn idmapped_tree(source: &Path, userns: &OwnedFd) -> Result<OwnedFd> {
    let src = cstr(source)?;
    // SAFETY: open_tree with a valid C string and flags; returns a new fd or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC,
        )
    };
    if tree < 0 {
        return Err(SysError::last(format!("open_tree {}", source.display())));
    }
    // SAFETY: fresh fd from the kernel, owned here.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `attr` is a properly laid out mount_attr that lives across the call; the size
    // passed matches it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(SysError::last(format!(
            "mount_setattr(idmap) {}",
            source.display()
        )));
    }
    Ok(tree)
}

/// Attaches the detached mount `tree` (from [`idmapped_tree`]) at `target` in the caller's
/// mount namespace.
pub fn attach_tree(tree: &impl AsRawFd, target: &Path) -> Result<()> {
    let dst = cstr(target)?;
    let empty = c"";
    // SAFETY: move_mount with a valid detached tree fd and C string target.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            dst.as_ptr(),
            0x0000_0004u32, // MOVE_MOUNT_F_EMPTY_PATH
        )
    };
    if r < 0 {
        return Err(SysError::last(format!(
            "move_mount to {}",
            target.display()
        )));
    }
    Ok(())
}

/// True if `path` is a mount point (its `st_dev` differs from its parent's, or it is listed
/// in /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|mp| unescape(mp) == want))
}

/// Mount points at or under `prefix`, deepest first (the order to unmount them in).
pub fn mounts_under(prefix: &Path) -> Vec<String> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let p = prefix.to_string_lossy().trim_end_matches('/').to_string();
    let mut out: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape))
        .filter(|mp| *mp == p || mp.starts_with(&format!("{p}/")))
        .collect();
    out.sort_by_key(|m| std::cmp::Reverse(m.len()));
    out.dedup();
    out
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// `statfs(2)` magic of the file system that holds `fd`.
pub fn fs_magic(fd: &impl AsRawFd) -> Result<i64> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: fstatfs writes a `struct statfs` into the buffer we own; it is only read after
    // the call succeeded.
    let r = unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) };
    if r < 0 {
        return Err(SysError::last("fstatfs"));
    }
    // SAFETY: fstatfs succeeded, so the kernel filled the whole struct.
    let st = unsafe { st.assume_init() };
    // `f_type`'s integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as i64)
}

/// True when the directory `path` (reached without following links) is on a file system of
/// type `magic`.
pub fn holds_fs(path: &Path, magic: i64) -> bool {
    open_dir_nofollow(path).is_ok_and(|fd| fs_magic(&fd).ok() == Some(magic))
}

/// `SYSFS_MAGIC` of statfs(2).
pub const SYSFS_MAGIC: i64 = 0x6265_6572;
/// `DEVPTS_SUPER_MAGIC` of statfs(2).
pub const DEVPTS_MAGIC: i64 = 0x1cd1;

/// Opens the directory `path` as an `O_PATH` handle, refusing any symbolic link on the way
/// (`openat2` with `RESOLVE_NO_SYMLINKS`): a path inside a sandbox's mount namespace, which
/// the sandbox may have rearranged, resolves to what it names or not at all.
pub fn open_dir_nofollow(path: &Path) -> Result<OwnedFd> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    let p = cstr(path)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 with a valid C string and an `open_how` laid out as the kernel's,
    // whose size is passed; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            p.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(SysError::last(format!("open {}", path.display())));
    }
    // SAFETY: a fresh fd from the kernel, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `fsconfig(2)` on the file system context `fs`: `cmd` with an optional key and string value
/// (`FSCONFIG_SET_FLAG` takes a key, `FSCONFIG_SET_STRING` both, the `FSCONFIG_CMD_*` neither).
fn fsconfig(
    fs: &OwnedFd,
    cmd: u32,
    key: Option<&std::ffi::CStr>,
    value: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    let key = key.map_or(std::ptr::null(), std::ffi::CStr::as_ptr);
    let value = value.map_or(std::ptr::null(), std::ffi::CStr::as_ptr);
    // SAFETY: fsconfig on a context fd we own, with NUL-terminated strings or null pointers
    // that live across the call (aux is 0: no fd is passed).
    let r = unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), cmd, key, value, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Mounts a new devpts instance (its own PTY numbering, `ptmxmode=0666,mode=0620`,
/// `nosuid,noexec`) on the directory `dir` with the new mount API, so the target is the
/// directory the handle names and no path is resolved again.
pub fn mount_devpts_on(dir: &OwnedFd) -> Result<()> {
    const FSOPEN_CLOEXEC: u32 = 1;
    const FSCONFIG_SET_STRING: u32 = 1;
    const FSCONFIG_CMD_CREATE: u32 = 6;
    const FSMOUNT_CLOEXEC: u32 = 1;
    const MOUNT_ATTR_NOSUID: u32 = 0x02;
    const MOUNT_ATTR_NOEXEC: u32 = 0x08;
    const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x04;
    const MOVE_MOUNT_T_EMPTY_PATH: u32 = 0x40;
    let name = c"devpts";
    // SAFETY: fsopen with a valid C string; returns a new fd or -1.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(SysError::last("fsopen devpts"));
    }
    // SAFETY: a fresh fd from the kernel, owned here.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    for (k, v) in [(c"ptmxmode", c"0666"), (c"mode", c"0620")] {
        fsconfig(&fs, FSCONFIG_SET_STRING, Some(k), Some(v))
            .map_err(|e| SysError::new("fsconfig devpts", e))?;
    }
    fsconfig(&fs, FSCONFIG_CMD_CREATE, None, None)
        .map_err(|e| SysError::new("create devpts", e))?;
    // SAFETY: fsmount of a created fs context; returns a new detached mount fd or -1.
    let m = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
        )
    };
    if m < 0 {
        return Err(SysError::last("fsmount devpts"));
    }
    // SAFETY: a fresh fd from the kernel, owned here.
    let m = unsafe { OwnedFd::from_raw_fd(m as i32) };
    let empty = c"";
    // SAFETY: move_mount from the detached mount fd onto the directory fd, both with empty
    // paths (the flags say so).
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            m.as_raw_fd(),
            empty.as_ptr(),
            dir.as_raw_fd(),
            empty.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(SysError::last("move_mount devpts"));
    }
    Ok(())
}

/// Reconfigures the file system mounted at `mountpoint` with exactly the flag options in
/// `flags` (`fspick` + `fsconfig`): options it has that are not named are turned off, so a
/// caller that adds one passes the current ones too. Mount flags (`nosuid`, `ro` of the
/// mount) are not touched. Nothing changes when an option is refused.
pub fn reconfigure_flags(mountpoint: &Path, flags: &[&str]) -> Result<()> {
    const FSPICK_CLOEXEC: u32 = 1;
    const FSCONFIG_SET_FLAG: u32 = 0;
    const FSCONFIG_CMD_RECONFIGURE: u32 = 7;
    let path = cstr(mountpoint)?;
    // SAFETY: fspick with a valid C string path; returns a new fd or -1.
    let fs = unsafe {
        libc::syscall(
            libc::SYS_fspick,
            libc::AT_FDCWD,
            path.as_ptr(),
            FSPICK_CLOEXEC,
        )
    };
    if fs < 0 {
        return Err(SysError::last(format!("fspick {}", mountpoint.display())));
    }
    // SAFETY: a fresh fd from the kernel, owned here.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    for flag in flags {
        let key = CString::new(*flag)
            .map_err(|_| SysError::new("mount option", std::io::Error::other("NUL in option")))?;
        fsconfig(&fs, FSCONFIG_SET_FLAG, Some(&key), None)
            .map_err(|e| SysError::new(format!("fsconfig {flag}"), e))?;
    }
    fsconfig(&fs, FSCONFIG_CMD_RECONFIGURE, None, None)
        .map_err(|e| SysError::new(format!("reconfigure {}", mountpoint.display()), e))
}
