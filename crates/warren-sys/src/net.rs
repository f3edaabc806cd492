//! Minimal network interface control.

use crate::{Result, SysError};
use std::os::fd::AsRawFd;

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> Result<()> {
    let sock =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"));
    let sock = sock.map_err(|e| SysError::new("socket for SIOCSIFFLAGS", e))?;
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo\0".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills `req`, which lives across the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(SysError::last("SIOCGIFFLAGS lo"));
    }
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS set.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(SysError::last("SIOCSIFFLAGS lo"));
    }
    Ok(())
}
