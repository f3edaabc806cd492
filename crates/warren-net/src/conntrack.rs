//! Connection tracking of sandbox addresses: forgetting every flow of an address before the
//! address is given to another sandbox.
//!
//! The host forwards a sandbox's traffic, so the host's connection-tracking table holds its
//! flows (their `established` replies pass the forward chain). An entry outlives the link it
//! was made through: without this, the next sandbox given the same address would receive
//! the previous one's replies (a UDP peer that keeps sending, a TCP peer's retransmits).
//! [`forget`] removes every IPv4 entry whose original or reply tuple names an address of a
//! network (one sandbox address, or the whole pool at start), through ctnetlink: a dump of
//! the table, then one delete per matching entry by its original tuple (and zone). Entries
//! gone in between (`ENOENT`) are fine. It talks netlink itself (the `conntrack` tool need
//! not be installed) with the message types of `netlink-packet-netfilter`.
//!
//! Blocking: call it from a thread that may block (`spawn_blocking`).

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_packet_netfilter::conntrack::{ConntrackAttribute, ConntrackMessage, IPTuple, Tuple};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::{constants::NETLINK_NETFILTER, Socket, SocketAddr};

use crate::NetError;

/// `CTA_ZONE`: an entry's zone, needed to find it again for the delete.
const CTA_ZONE: u16 = 18;

/// Does `a` lie in `net/len`?
fn within(a: Ipv4Addr, net: Ipv4Addr, len: u8) -> bool {
    let mask = u32::MAX
        .checked_shl(32 - u32::from(len.min(32)))
        .unwrap_or(0);
    u32::from(a) & mask == u32::from(net) & mask
}

/// The IPv4 addresses a tuple names.
fn addresses(tuple: &[Tuple]) -> impl Iterator<Item = Ipv4Addr> + '_ {
    tuple
        .iter()
        .filter_map(|t| match t {
            Tuple::Ip(ips) => Some(ips),
            _ => None,
        })
        .flatten()
        .filter_map(|ip| match ip {
            IPTuple::SourceAddress(IpAddr::V4(a)) | IPTuple::DestinationAddress(IpAddr::V4(a)) => {
                Some(*a)
            }
            _ => None,
        })
}

/// From one dumped entry, what deletes it, if it involves `net/len`.
pub(crate) fn delete_request(
    attrs: &[ConntrackAttribute],
    net: Ipv4Addr,
    len: u8,
) -> Option<Vec<ConntrackAttribute>> {
    let mut orig = None;
    let mut hit = false;
    let mut zone = None;
    for a in attrs {
        match a {
            ConntrackAttribute::CtaTupleOrig(t) => {
                hit |= addresses(t).any(|x| within(x, net, len));
                orig = Some(t.clone());
            }
            ConntrackAttribute::CtaTupleReply(t) => {
                hit |= addresses(t).any(|x| within(x, net, len));
            }
            ConntrackAttribute::Other(nla) if netlink_packet_core::Nla::kind(nla) == CTA_ZONE => {
                zone = Some(a.clone());
            }
            _ => {}
        }
    }
    let orig = orig.filter(|_| hit)?;
    let mut req = vec![ConntrackAttribute::CtaTupleOrig(orig)];
    req.extend(zone);
    Some(req)
}

struct Ctnl {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Ctnl {
    fn open() -> Result<Ctnl, NetError> {
        let io = |what: &str, e: std::io::Error| NetError::Io {
            what: format!("conntrack netlink: {what}"),
            source: e,
        };
        let mut sock = Socket::new(NETLINK_NETFILTER).map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::EPROTONOSUPPORT) {
                NetError::ConntrackUnsupported(format!("no netfilter netlink: {e}"))
            } else {
                io("socket", e)
            }
        })?;
        sock.bind_auto().map_err(|e| io("bind", e))?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(|e| io("connect", e))?;
        Ok(Ctnl {
            sock,
            seq: 0,
            buf: Vec::with_capacity(1 << 18),
        })
    }

    fn send(&mut self, flags: u16, msg: ConntrackMessage) -> Result<u32, NetError> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = flags;
        header.sequence_number = self.seq;
        let inner =
            NetfilterMessage::new(NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0), msg);
        let mut m = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(inner));
        m.finalize();
        let mut out = vec![0u8; m.buffer_len()];
        m.serialize(&mut out);
        self.sock.send(&out, 0).map_err(|e| NetError::Io {
            what: "conntrack netlink: send".into(),
            source: e,
        })?;
        Ok(self.seq)
    }

    /// Reads the answers to request `seq` and hands each entry to `each` until the end of a
    /// dump or the request's acknowledgement. `Ok(Some(errno))` is the kernel's refusal.
    fn answers(
        &mut self,
        seq: u32,
        mut each: impl FnMut(Vec<ConntrackAttribute>),
    ) -> Result<Option<i32>, NetError> {
        loop {
            self.buf.clear();
            let n = self
                .sock
                .recv(&mut self.buf, nix::libc::MSG_TRUNC)
                .map_err(|e| NetError::Io {
                    what: "conntrack netlink: receive".into(),
                    source: e,
                })?;
            if n > self.buf.len() {
                return Err(NetError::netlink(
                    "conntrack",
                    format!("a message of {n} bytes does not fit the buffer"),
                ));
            }
            let mut off = 0;
            while off < n {
                let m = NetlinkMessage::<NetfilterMessage>::deserialize(&self.buf[off..n])
                    .map_err(|e| NetError::netlink("conntrack: parse an answer", e))?;
                let len = m.header.length as usize;
                if len == 0 {
                    return Err(NetError::netlink("conntrack", "an empty netlink message"));
                }
                off += (len + 3) & !3;
                if m.header.sequence_number != seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(None),
                    NetlinkPayload::Error(e) => return Ok(e.code.map(|c| -c.get())),
                    NetlinkPayload::InnerMessage(NetfilterMessage {
                        inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attrs)),
                        ..
                    }) => each(attrs),
                    _ => {}
                }
            }
        }
    }
}

/// Whether this kernel lets the host's tracked connections be listed and deleted
/// ([`NetError::ConntrackUnsupported`] if not). Reads the table once.
pub fn probe() -> Result<(), NetError> {
    // TEST-NET-2: no flow of the host names it.
    forget(Ipv4Addr::new(198, 51, 100, 77), 32).map(|_| ())
}

/// Removes every IPv4 connection-tracking entry of the host's namespace that involves an
/// address of `net/len` (either direction). Returns how many were removed.
pub fn forget(net: Ipv4Addr, len: u8) -> Result<usize, NetError> {
    let mut c = Ctnl::open()?;
    let seq = c.send(
        NLM_F_REQUEST | NLM_F_DUMP,
        ConntrackMessage::Get(Vec::new()),
    )?;
    let mut doomed = Vec::new();
    if let Some(errno) = c.answers(seq, |attrs| {
        doomed.extend(delete_request(&attrs, net, len));
    })? {
        // nfnetlink answers a subsystem it does not have (after trying to load its module)
        // with EOPNOTSUPP.
        if matches!(errno, nix::libc::EOPNOTSUPP | nix::libc::EPROTONOSUPPORT) {
            return Err(NetError::ConntrackUnsupported(format!(
                "a dump of the table is refused: {}",
                std::io::Error::from_raw_os_error(errno)
            )));
        }
        return Err(NetError::netlink(
            "conntrack: dump",
            std::io::Error::from_raw_os_error(errno),
        ));
    }
    let mut removed = 0;
    for req in doomed {
        let seq = c.send(NLM_F_REQUEST | NLM_F_ACK, ConntrackMessage::Delete(req))?;
        match c.answers(seq, |_| {})? {
            None => removed += 1,
            Some(nix::libc::ENOENT) => {}
            Some(errno) => {
                return Err(NetError::netlink(
                    "conntrack: delete an entry",
                    std::io::Error::from_raw_os_error(errno),
                ))
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_netfilter::conntrack::{ProtoTuple, Protocol};

    fn tuple(src: &str, dst: &str) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(src.parse().unwrap()),
                IPTuple::DestinationAddress(dst.parse().unwrap()),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(Protocol::Udp),
                ProtoTuple::SourcePort(40000),
                ProtoTuple::DestinationPort(53),
            ]),
        ]
    }

    #[test]
    fn the_kernel_table_is_read_and_entries_of_other_addresses_stay() {
        if !nix::unistd::Uid::effective().is_root() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: the conntrack table must be readable"
            );
            eprintln!("skipped: reading the conntrack table needs root");
            return;
        }
        match forget("198.51.100.77".parse().unwrap(), 32) {
            // The host's own flows are dumped and parsed; none is in TEST-NET-2.
            Ok(n) => assert_eq!(n, 0),
            Err(e @ NetError::ConntrackUnsupported(_)) => {
                assert!(
                    std::env::var("CI").map_or(true, |v| v != "true"),
                    "this test cannot run under CI=true: {e}"
                );
                eprintln!("SKIP: {e}");
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn entries_of_the_address_in_either_direction_are_chosen() {
        let net: Ipv4Addr = "10.201.3.2".parse().unwrap();
        // A masqueraded flow: the sandbox is only in the original tuple.
        let out = [
            ConntrackAttribute::CtaTupleOrig(tuple("10.201.3.2", "1.1.1.1")),
            ConntrackAttribute::CtaTupleReply(tuple("1.1.1.1", "192.168.0.5")),
        ];
        let req = delete_request(&out, net, 32).expect("chosen");
        assert_eq!(req, vec![out[0].clone()]);
        // Only in the reply (a flow towards it that was translated).
        let back = [
            ConntrackAttribute::CtaTupleOrig(tuple("1.1.1.1", "192.168.0.5")),
            ConntrackAttribute::CtaTupleReply(tuple("10.201.3.2", "1.1.1.1")),
        ];
        assert!(delete_request(&back, net, 32).is_some());
        // The neighbour at .6 is not this address, but is in the pool.
        let other = [
            ConntrackAttribute::CtaTupleOrig(tuple("10.201.3.6", "1.1.1.1")),
            ConntrackAttribute::CtaTupleReply(tuple("1.1.1.1", "10.201.3.6")),
        ];
        assert!(delete_request(&other, net, 32).is_none());
        assert!(delete_request(&other, "10.201.0.0".parse().unwrap(), 16).is_some());
        assert!(delete_request(&other, "0.0.0.0".parse().unwrap(), 0).is_some());
    }
}
