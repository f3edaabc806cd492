//! What a VM guest's init needs and a container never does: loading kernel modules and
//! switching from the initramfs to the real root.

use crate::{Result, SysError};
use nix::mount::MsFlags;
use std::ffi::CString;
use std::path::Path;

/// Loads a kernel module from a file (`finit_module(2)`). A module already loaded is fine.
pub fn load_module(path: &Path) -> Result<()> {
    let file = std::fs::File::open(path)
        .map_err(|e| SysError::new(format!("open {}", path.display()), e))?;
    let params = CString::default();
    match nix::kmod::finit_module(&file, &params, nix::kmod::ModuleInitFlags::empty()) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(SysError::errno(
            format!("finit_module {}", path.display()),
            e,
        )),
    }
}

/// Makes `new_root` the root of the calling process: the initramfs (rootfs) cannot be
/// `pivot_root`ed away, so the new root is moved over `/` and entered with `chroot`, as
/// `switch_root(8)` does.
pub fn switch_root(new_root: &Path) -> Result<()> {
    nix::unistd::chdir(new_root)
        .map_err(|e| SysError::errno(format!("chdir {}", new_root.display()), e))?;
    crate::mount::mount(Some("."), Path::new("/"), None, MsFlags::MS_MOVE, None)?;
    nix::unistd::chroot(".").map_err(|e| SysError::errno("chroot .", e))?;
    nix::unistd::chdir("/").map_err(|e| SysError::errno("chdir /", e))
}
