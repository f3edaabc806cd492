//! btrfs subvolumes and their quota groups: what holds each container sandbox's writable layer
//! to its own byte limit where one file system serves all of them (see
//! `warren_runtime::container::writable`).
//!
//! The calls are the kernel's btrfs ioctls (`include/uapi/linux/btrfs.h`); every one of them
//! works on an open directory of the file system, so nothing here needs the block device.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use crate::{Result, SysError};

/// `BTRFS_SUPER_MAGIC` of statfs(2).
pub const BTRFS_MAGIC: i64 = 0x9123_683e;

const IOCTL_MAGIC: u8 = 0x94;
const SUBVOL_NAME_MAX: usize = 4039;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; 4088],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_ioctl_fs_info_args`.
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}

// The request number's type differs between C libraries (an unsigned long with glibc, an
// int with musl, which the agent is built with): kept as `c_ulong` and cast at the call.
#[allow(clippy::unnecessary_cast)]
const SUBVOL_CREATE: libc::c_ulong =
    nix::request_code_write!(IOCTL_MAGIC, 14, std::mem::size_of::<VolArgs>()) as libc::c_ulong;
#[allow(clippy::unnecessary_cast)]
const SNAP_DESTROY: libc::c_ulong =
    nix::request_code_write!(IOCTL_MAGIC, 15, std::mem::size_of::<VolArgs>()) as libc::c_ulong;
#[allow(clippy::unnecessary_cast)]
const INO_LOOKUP: libc::c_ulong =
    nix::request_code_readwrite!(IOCTL_MAGIC, 18, std::mem::size_of::<InoLookupArgs>())
        as libc::c_ulong;
#[allow(clippy::unnecessary_cast)]
const FS_INFO: libc::c_ulong =
    nix::request_code_read!(IOCTL_MAGIC, 31, std::mem::size_of::<FsInfoArgs>()) as libc::c_ulong;
#[allow(clippy::unnecessary_cast)]
const QUOTA_CTL: libc::c_ulong =
    nix::request_code_readwrite!(IOCTL_MAGIC, 40, std::mem::size_of::<QuotaCtlArgs>())
        as libc::c_ulong;
#[allow(clippy::unnecessary_cast)]
const QGROUP_LIMIT: libc::c_ulong =
    nix::request_code_read!(IOCTL_MAGIC, 43, std::mem::size_of::<QgroupLimitArgs>())
        as libc::c_ulong;

const QUOTA_CTL_ENABLE: u64 = 1;
const QUOTA_CTL_ENABLE_SIMPLE: u64 = 3;
const LIMIT_MAX_RFER: u64 = 1 << 0;
/// `BTRFS_FIRST_FREE_OBJECTID`: the root directory of every subvolume.
const FIRST_FREE_OBJECTID: u64 = 256;

fn open_dir(path: &Path) -> Result<OwnedFd> {
    std::fs::File::open(path)
        .map(OwnedFd::from)
        .map_err(|e| SysError::new(format!("open {}", path.display()), e))
}

/// Runs one btrfs ioctl with `arg` on the directory `dir`.
#[allow(clippy::unnecessary_cast)]
fn ioctl<T>(dir: &OwnedFd, request: libc::c_ulong, arg: &mut T, what: &str) -> Result<()> {
    // SAFETY: `arg` is a live, exclusively borrowed `#[repr(C)]` struct of exactly the size
    // encoded in `request` (the request codes above are built from these types), so the
    // kernel reads and writes only memory we own for the duration of the call.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), request as _, arg as *mut T) };
    if r < 0 {
        return Err(SysError::last(what.to_string()));
    }
    Ok(())
}

fn vol_args(name: &str) -> Result<VolArgs> {
    let c = CString::new(name).map_err(|_| {
        SysError::new(
            "subvolume name",
            std::io::Error::from_raw_os_error(libc::EINVAL),
        )
    })?;
    let bytes = c.as_bytes();
    if bytes.is_empty() || bytes.len() > SUBVOL_NAME_MAX || name.contains('/') {
        return Err(SysError::new(
            format!("subvolume name {name:?}"),
            std::io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    let mut a = VolArgs {
        fd: 0,
        name: [0; 4088],
    };
    a.name[..bytes.len()].copy_from_slice(bytes);
    Ok(a)
}

/// Whether `path` is on a btrfs.
pub fn is_btrfs(path: &Path) -> bool {
    crate::mount::holds_fs(path, BTRFS_MAGIC)
}

/// Creates the subvolume `parent/name`.
pub fn create_subvolume(parent: &Path, name: &str) -> Result<()> {
    let dir = open_dir(parent)?;
    let mut a = vol_args(name)?;
    ioctl(
        &dir,
        SUBVOL_CREATE,
        &mut a,
        &format!("create subvolume {name}"),
    )
}

/// Deletes the subvolume `parent/name` with everything in it (the space is given back by the
/// file system's cleaner, after this returns).
pub fn delete_subvolume(parent: &Path, name: &str) -> Result<()> {
    let dir = open_dir(parent)?;
    let mut a = vol_args(name)?;
    ioctl(
        &dir,
        SNAP_DESTROY,
        &mut a,
        &format!("delete subvolume {name}"),
    )
}

/// Commits the file system holding `path` (`syncfs`): its quota groups' counts, which btrfs
/// updates at each transaction commit (every 30 s by default), are current afterwards.
pub fn commit(path: &Path) -> Result<()> {
    let dir = open_dir(path)?;
    nix::unistd::syncfs(dir.as_raw_fd())
        .map_err(|e| SysError::errno(format!("syncfs {}", path.display()), e))
}

/// The id of the subvolume whose root directory is `path`.
pub fn subvolume_id(path: &Path) -> Result<u64> {
    let dir = open_dir(path)?;
    let mut a = InoLookupArgs {
        treeid: 0,
        objectid: FIRST_FREE_OBJECTID,
        name: [0; 4080],
    };
    ioctl(&dir, INO_LOOKUP, &mut a, "look up the subvolume id")?;
    Ok(a.treeid)
}

/// The file system's id (the name of its directory under `/sys/fs/btrfs`).
pub fn fsid(path: &Path) -> Result<String> {
    let dir = open_dir(path)?;
    // SAFETY: an all-zero FsInfoArgs is a valid value of this plain-integer struct.
    let mut a: FsInfoArgs = unsafe { std::mem::zeroed() };
    ioctl(&dir, FS_INFO, &mut a, "read the btrfs file system id")?;
    let h: String = a.fsid.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// Which accounting [`enable_quota`] turned on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaMode {
    /// Simple quotas: each extent is charged to the subvolume that wrote it (cheap).
    Simple,
    /// Full quota groups (back-reference walks on every commit).
    Full,
}

/// Turns quota accounting on for the file system holding `path`: simple quotas where the
/// kernel has them, else full quota groups. Enabling an enabled quota is a no-op.
pub fn enable_quota(path: &Path) -> Result<QuotaMode> {
    let dir = open_dir(path)?;
    let mut a = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE_SIMPLE,
        status: 0,
    };
    if ioctl(&dir, QUOTA_CTL, &mut a, "enable simple quotas").is_ok() {
        return Ok(QuotaMode::Simple);
    }
    let mut a = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    ioctl(&dir, QUOTA_CTL, &mut a, "enable btrfs quotas")?;
    Ok(QuotaMode::Full)
}

/// Limits the subvolume whose root directory is `subvolume` to `bytes` (referenced: data and
/// metadata it holds; writes beyond fail with `EDQUOT`).
pub fn limit_subvolume(subvolume: &Path, bytes: u64) -> Result<()> {
    let dir = open_dir(subvolume)?;
    let mut a = QgroupLimitArgs {
        qgroupid: 0,
        lim: QgroupLimit {
            flags: LIMIT_MAX_RFER,
            max_rfer: bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    ioctl(&dir, QGROUP_LIMIT, &mut a, "limit the subvolume")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_match_the_kernel() {
        assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
        assert_eq!(std::mem::size_of::<InoLookupArgs>(), 4096);
        assert_eq!(std::mem::size_of::<FsInfoArgs>(), 1024);
        assert_eq!(std::mem::size_of::<QuotaCtlArgs>(), 16);
        assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
    }

    #[test]
    fn names_with_slashes_or_nul_are_refused() {
        assert!(vol_args("a/b").is_err());
        assert!(vol_args("a\0b").is_err());
        assert!(vol_args("").is_err());
        assert!(vol_args("node-01ABC").is_ok());
    }
}
