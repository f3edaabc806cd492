//! Pseudo-terminals.

use crate::{Result, SysError};
use std::os::fd::{AsRawFd, OwnedFd};

/// Opens a new pty pair `(master, slave)` with the given size; both close-on-exec.
pub fn open(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd)> {
    let ws = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let p = nix::pty::openpty(Some(&ws), None).map_err(|e| SysError::errno("openpty", e))?;
    crate::fd::set_cloexec(&p.master, true)?;
    crate::fd::set_cloexec(&p.slave, true)?;
    Ok((p.master, p.slave))
}

/// Resizes the terminal behind `fd`.
pub fn resize(fd: &OwnedFd, cols: u16, rows: u16) -> Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that lives across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(SysError::last("ioctl(TIOCSWINSZ)"));
    }
    Ok(())
}
