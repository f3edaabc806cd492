//! The network interface of a VM guest (`Call::Network`): the daemon tells the agent the
//! address of the sandbox's link, which the guest's own `eth0` holds (a container's link is
//! configured from the host instead). Never touches any other interface.

use std::path::Path;

/// The guest's network interface (virtio-net; no udev renames it).
const NIC: &str = "eth0";

/// `Call::Network`: configures (or clears) the guest's interface, then writes its
/// resolv.conf. Only a VM guest has one to configure: a container's link is set up from the
/// host.
pub fn configure(
    config: Option<&warren_proto::GuestNet>,
    resolv_conf: Option<&str>,
) -> warren_proto::Event {
    use warren_proto::Event;
    use warren_types::ErrorCode;
    if std::process::id() != 1 || !Path::new("/sys/class/net").join(NIC).exists() {
        return Event::error(
            ErrorCode::InvalidRequest,
            format!("this sandbox has no guest network interface {NIC}"),
        );
    }
    let cfg = match config.map(parse_net).transpose() {
        Ok(c) => c,
        Err(m) => return Event::error(ErrorCode::InvalidRequest, m),
    };
    if let Err(e) = warren_sys::net::configure(NIC, cfg.as_ref()) {
        return Event::error(ErrorCode::Internal, format!("configure {NIC}: {e}"));
    }
    if let Some(text) = resolv_conf {
        // Beside it, then renamed over it: a reader never sees half a file.
        let tmp = Path::new("/etc/.resolv.conf.warren");
        let res = std::fs::write(tmp, text).and_then(|()| std::fs::rename(tmp, "/etc/resolv.conf"));
        if let Err(e) = res {
            let _ = std::fs::remove_file(tmp);
            return Event::error(ErrorCode::Internal, format!("write /etc/resolv.conf: {e}"));
        }
    }
    Event::Done
}

fn parse_net(n: &warren_proto::GuestNet) -> Result<warren_sys::net::InterfaceConfig, String> {
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = n.mac.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("bad MAC address {:?}", n.mac));
    }
    for (i, p) in parts.iter().enumerate() {
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| format!("bad MAC address {:?}", n.mac))?;
    }
    if n.prefix_len > 32 || !(68..=65535).contains(&n.mtu) {
        return Err(format!(
            "bad prefix length {} or MTU {}",
            n.prefix_len, n.mtu
        ));
    }
    Ok(warren_sys::net::InterfaceConfig {
        mac,
        address: n.address,
        prefix_len: n.prefix_len,
        gateway: n.gateway,
        mtu: n.mtu,
    })
}
