//! Minimal network interface control.

use crate::{Result, SysError};
use std::os::fd::AsRawFd;

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> Result<()> {
    let sock =
        std::net::UdpSocket::bind("0.0.0.0:0").or_else(|_| std::net::UdpSocket::bind("[::]:0"));
    let sock = sock.map_err(|e| SysError::new("socket for SIOCSIFFLAGS", e))?;
    set_up(&sock, "lo", true)
}

/// What [`configure`] gives an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceConfig {
    pub mac: [u8; 6],
    pub address: std::net::Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: std::net::Ipv4Addr,
    pub mtu: u32,
}

fn ifreq(name: &str) -> Result<libc::ifreq> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(SysError::new(
            "interface name",
            std::io::Error::from(std::io::ErrorKind::InvalidInput),
        ));
    }
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in name.bytes().enumerate() {
        req.ifr_name[i] = b as libc::c_char;
    }
    Ok(req)
}

fn sockaddr_in(a: std::net::Ipv4Addr) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(a).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size (16 bytes) and any bit pattern is
    // a valid sockaddr.
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

/// An ioctl request number as the C library's `ioctl` takes it: `libc` spells the `SIOC*`
/// numbers as `c_ulong`, which glibc's `ioctl` takes and musl's (a `c_int`) does not.
#[allow(clippy::unnecessary_cast)] // a no-op with glibc, a narrowing with musl
fn request(op: libc::c_ulong) -> libc::Ioctl {
    op as libc::Ioctl
}

fn ioctl(
    sock: &std::net::UdpSocket,
    op: libc::c_ulong,
    req: &mut libc::ifreq,
    what: &str,
) -> Result<()> {
    // SAFETY: every SIOC*IF* request used here reads or fills the `ifreq` that lives across
    // the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request(op), req as *mut libc::ifreq) } < 0 {
        return Err(SysError::last(what));
    }
    Ok(())
}

fn set_up(sock: &std::net::UdpSocket, name: &str, up: bool) -> Result<()> {
    let mut req = ifreq(name)?;
    ioctl(
        sock,
        libc::SIOCGIFFLAGS,
        &mut req,
        &format!("SIOCGIFFLAGS {name}"),
    )?;
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS set.
    unsafe {
        let f = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if up {
            req.ifr_ifru.ifru_flags |= f;
        } else {
            req.ifr_ifru.ifru_flags &= !f;
        }
    }
    ioctl(
        sock,
        libc::SIOCSIFFLAGS,
        &mut req,
        &format!("SIOCSIFFLAGS {name}"),
    )
}

/// Configures interface `name` of the current network namespace: MAC, MTU, address, up, and
/// a default route via the gateway. With `None`, takes the interface down and its address
/// away (routes through it go with it).
pub fn configure(name: &str, cfg: Option<&InterfaceConfig>) -> Result<()> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")
        .map_err(|e| SysError::new("socket for interface ioctls", e))?;
    // Down first: a MAC change needs it on some drivers, and it drops the old routes.
    set_up(&sock, name, false)?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    // An interface that never had an address says EADDRNOTAVAIL: it has none either way.
    let _ = ioctl(&sock, libc::SIOCSIFADDR, &mut req, "SIOCSIFADDR");
    let Some(c) = cfg else { return Ok(()) };
    let mut req = ifreq(name)?;
    // SAFETY: sockaddr is plain old data; zeroed is a valid value.
    let mut hw: libc::sockaddr = unsafe { std::mem::zeroed() };
    hw.sa_family = libc::ARPHRD_ETHER;
    for (i, b) in c.mac.iter().enumerate() {
        hw.sa_data[i] = *b as libc::c_char;
    }
    req.ifr_ifru.ifru_hwaddr = hw;
    ioctl(&sock, libc::SIOCSIFHWADDR, &mut req, "SIOCSIFHWADDR")?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_mtu = c.mtu as libc::c_int;
    ioctl(&sock, libc::SIOCSIFMTU, &mut req, "SIOCSIFMTU")?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_addr = sockaddr_in(c.address);
    ioctl(&sock, libc::SIOCSIFADDR, &mut req, "SIOCSIFADDR")?;
    let mask = match c.prefix_len {
        0 => 0,
        n => u32::MAX << (32 - u32::from(n.min(32))),
    };
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_netmask = sockaddr_in(std::net::Ipv4Addr::from(mask));
    ioctl(&sock, libc::SIOCSIFNETMASK, &mut req, "SIOCSIFNETMASK")?;
    set_up(&sock, name, true)?;
    // SAFETY: rtentry is plain old data; zeroed is a valid value.
    let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
    rt.rt_dst = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_genmask = sockaddr_in(std::net::Ipv4Addr::UNSPECIFIED);
    rt.rt_gateway = sockaddr_in(c.gateway);
    rt.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
    // SAFETY: SIOCADDRT reads `rt`, which lives across the call.
    if unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            request(libc::SIOCADDRT),
            &mut rt as *mut libc::rtentry,
        )
    } < 0
    {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(SysError::new("SIOCADDRT default route", e));
        }
    }
    Ok(())
}

/// A new IPv4 TCP socket (non-blocking, close-on-exec), not yet connected, in the calling
/// thread's network namespace. A socket keeps the namespace it was made in: made on a thread
/// that joined a sandbox's namespace, it connects to that sandbox's loopback from anywhere.
pub fn tcp_socket() -> Result<std::os::fd::OwnedFd> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(|e| SysError::errno("socket(AF_INET, SOCK_STREAM)", e))
}
