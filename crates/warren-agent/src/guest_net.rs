//! The network interface of a VM guest (`Call::Network`): the daemon tells the agent the
//! address of the sandbox's link, which the guest's own `eth0` holds (a container's link is
//! configured from the host instead). Never touches any other interface.

use std::path::Path;

use crate::error::AgentError;

/// The guest's network interface (virtio-net; no udev renames it).
const NIC: &str = "eth0";

/// `Call::Network`: configures (or clears) the guest's interface, then writes its
/// resolv.conf. Only a VM guest has one to configure: a container's link is set up from the
/// host.
pub fn configure(
    config: Option<&warren_proto::GuestNet>,
    resolv_conf: Option<&str>,
) -> warren_proto::Event {
    match apply(config, resolv_conf) {
        Ok(()) => warren_proto::Event::Done,
        Err(e) => warren_proto::Event::error(e.code(), e.to_string()),
    }
}

fn apply(
    config: Option<&warren_proto::GuestNet>,
    resolv_conf: Option<&str>,
) -> Result<(), AgentError> {
    if std::process::id() != 1 || !Path::new("/sys/class/net").join(NIC).exists() {
        return Err(AgentError::Invalid(format!(
            "this sandbox has no guest network interface {NIC}"
        )));
    }
    let cfg = config.map(parse_net).transpose()?;
    warren_sys::net::configure(NIC, cfg.as_ref())
        .map_err(|e| AgentError::Setup(format!("configure {NIC}: {e}")))?;
    if let Some(text) = resolv_conf {
        // Beside it, then renamed over it: a reader never sees half a file.
        let tmp = Path::new("/etc/.resolv.conf.warren");
        let res = std::fs::write(tmp, text).and_then(|()| std::fs::rename(tmp, "/etc/resolv.conf"));
        if let Err(e) = res {
            let _ = std::fs::remove_file(tmp);
            return Err(AgentError::io("write /etc/resolv.conf")(e));
        }
    }
    Ok(())
}

fn parse_net(n: &warren_proto::GuestNet) -> Result<warren_sys::net::InterfaceConfig, AgentError> {
    let bad_mac = || AgentError::Invalid(format!("bad MAC address {:?}", n.mac));
    let mut mac = [0u8; 6];
    let parts: Vec<&str> = n.mac.split(':').collect();
    if parts.len() != 6 {
        return Err(bad_mac());
    }
    for (i, p) in parts.iter().enumerate() {
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| bad_mac())?;
    }
    if n.prefix_len > 32 || !(68..=65535).contains(&n.mtu) {
        return Err(AgentError::Invalid(format!(
            "bad prefix length {} or MTU {}",
            n.prefix_len, n.mtu
        )));
    }
    Ok(warren_sys::net::InterfaceConfig {
        mac,
        address: n.address,
        prefix_len: n.prefix_len,
        gateway: n.gateway,
        mtu: n.mtu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::ErrorCode;

    fn net(mac: &str, prefix_len: u8, mtu: u32) -> warren_proto::GuestNet {
        warren_proto::GuestNet {
            mac: mac.into(),
            address: "10.0.0.2".parse().unwrap(),
            prefix_len,
            gateway: "10.0.0.1".parse().unwrap(),
            mtu,
        }
    }

    #[test]
    fn a_bad_interface_config_is_an_invalid_request() {
        let ok = parse_net(&net("02:00:0a:00:00:02", 30, 1500)).unwrap();
        assert_eq!(ok.mac, [2, 0, 10, 0, 0, 2]);
        for bad in [
            net("02:00:0a:00:00", 30, 1500),
            net("02:00:0a:00:00:zz", 30, 1500),
            net("02:00:0a:00:00:02", 33, 1500),
            net("02:00:0a:00:00:02", 30, 67),
        ] {
            let e = parse_net(&bad).unwrap_err();
            assert_eq!(e.code(), ErrorCode::InvalidRequest, "{e}");
        }
        // Outside a VM guest (not PID 1): refused, never touching the host's interfaces.
        match configure(Some(&net("02:00:0a:00:00:02", 30, 1500)), None) {
            warren_proto::Event::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("configured outside a guest: {other:?}"),
        }
    }
}
