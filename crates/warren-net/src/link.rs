//! Sandbox links: a veth pair per sandbox, configured over netlink (`rtnetlink`).
//!
//! The host end (`<prefix><index>`) stays in the host's namespace with the link's host
//! address; the peer is created directly inside the sandbox's network namespace (held open
//! as a [`Netns`]) as `eth0`, given the sandbox address and a default route via the host
//! end. The inside is configured from a dedicated thread that joins the sandbox's network
//! namespace (`setns`) and opens its own netlink socket there; the thread ends with the
//! work, so no runtime thread ever changes namespace.
//!
//! A VM sandbox's namespace is its VMM's and holds the VMM's tap device: there `eth0` gets
//! no address; it and the tap are ports of a bridge ([`BRIDGE_NAME`]), so the guest's own
//! interface holds the sandbox address and the host end sees the guest as its neighbour.

use futures::TryStreamExt;
use rtnetlink::packet_route::link::{InfoData, InfoKind, InfoVeth, LinkAttribute};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use std::net::{IpAddr, Ipv4Addr};

use crate::{NetError, Netns};

/// Name of the sandbox end.
pub const PEER_NAME: &str = "eth0";
/// Prefix length of every link (/30: host end, sandbox end).
pub const LINK_PREFIX: u8 = 30;
/// The bridge joining `eth0` and a VMM's tap inside a VM sandbox's namespace.
pub const BRIDGE_NAME: &str = "br0";

/// Runs `f` on a fresh thread with its own current-thread runtime and waits for it.
async fn on_thread<T, F, Fut>(f: F) -> Result<T, NetError>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, NetError>>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("warren-net-link".into())
        .spawn(move || {
            let res = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
                .map_err(|e| NetError::Io {
                    what: "netlink runtime".into(),
                    source: e,
                })
                .and_then(|rt| rt.block_on(f()));
            let _ = tx.send(res);
        })
        .map_err(|e| NetError::Io {
            what: "spawn netlink thread".into(),
            source: e,
        })?;
    rx.await
        .map_err(|_| NetError::netlink("netlink thread", "ended without an answer"))?
}

fn connect(what: &str) -> Result<Handle, NetError> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| NetError::netlink(what, e))?;
    tokio::spawn(conn);
    Ok(handle)
}

async fn index_of(h: &Handle, name: &str) -> Result<Option<u32>, NetError> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(m)) => Ok(Some(m.header.index)),
        Ok(None) => Ok(None),
        Err(rtnetlink::Error::NetlinkError(e))
            if e.code.map(|c| c.get()) == Some(-libc_enodev()) =>
        {
            Ok(None)
        }
        Err(e) => Err(NetError::netlink(format!("find link {name}"), e)),
    }
}

fn libc_enodev() -> i32 {
    nix::errno::Errno::ENODEV as i32
}

/// Creates the veth pair of a sandbox and configures both ends. With `tap` (a VM sandbox),
/// the sandbox end is bridged to that tap of the namespace instead of taking the address.
pub async fn create(
    ifname: String,
    netns: Netns,
    host: Ipv4Addr,
    peer: Ipv4Addr,
    tap: Option<String>,
) -> Result<(), NetError> {
    on_thread(move || async move {
        let h = connect("host netlink socket")?;
        let peer_msg = LinkMessageBuilder::<LinkUnspec>::default()
            .name(PEER_NAME.to_string())
            .setns_by_fd(std::os::fd::AsRawFd::as_raw_fd(&netns.fd()))
            .build();
        let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
            .name(ifname.clone())
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
            .build();
        h.link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| NetError::netlink(format!("add veth {ifname}"), e))?;
        let idx = index_of(&h, &ifname)
            .await?
            .ok_or_else(|| NetError::netlink(format!("veth {ifname}"), "vanished"))?;
        h.address()
            .add(idx, IpAddr::V4(host), LINK_PREFIX)
            .execute()
            .await
            .map_err(|e| NetError::netlink(format!("address of {ifname}"), e))?;
        h.link()
            .set(LinkUnspec::new_with_index(idx).up().build())
            .execute()
            .await
            .map_err(|e| NetError::netlink(format!("up {ifname}"), e))?;

        // The inside: join the sandbox's network namespace on this (throw-away) thread.
        nix::sched::setns(netns.fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| NetError::netlink("setns into the sandbox", e))?;
        let s = connect("sandbox netlink socket")?;
        let pidx = index_of(&s, PEER_NAME)
            .await?
            .ok_or_else(|| NetError::netlink("sandbox eth0", "missing"))?;
        if let Some(tap) = tap {
            return bridge(&s, pidx, &tap).await;
        }
        s.address()
            .add(pidx, IpAddr::V4(peer), LINK_PREFIX)
            .execute()
            .await
            .map_err(|e| NetError::netlink("sandbox address", e))?;
        s.link()
            .set(LinkUnspec::new_with_index(pidx).up().build())
            .execute()
            .await
            .map_err(|e| NetError::netlink("sandbox eth0 up", e))?;
        s.route()
            .add(RouteMessageBuilder::<Ipv4Addr>::new().gateway(host).build())
            .execute()
            .await
            .map_err(|e| NetError::netlink("sandbox default route", e))?;
        Ok(())
    })
    .await
}

/// Inside a VM sandbox's namespace: the bridge (made once; a later link joins the same one),
/// `eth0` and the VMM's tap as its ports, all up.
async fn bridge(s: &Handle, peer: u32, tap: &str) -> Result<(), NetError> {
    use rtnetlink::LinkBridge;
    let br = match index_of(s, BRIDGE_NAME).await? {
        Some(i) => i,
        None => {
            s.link()
                .add(LinkMessageBuilder::<LinkBridge>::new(BRIDGE_NAME).build())
                .execute()
                .await
                .map_err(|e| NetError::netlink("add the sandbox bridge", e))?;
            index_of(s, BRIDGE_NAME)
                .await?
                .ok_or_else(|| NetError::netlink("sandbox bridge", "vanished"))?
        }
    };
    let tidx = index_of(s, tap)
        .await?
        .ok_or_else(|| NetError::netlink(format!("VMM tap {tap}"), "missing"))?;
    for (idx, what) in [(peer, "eth0"), (tidx, "tap")] {
        s.link()
            .set(LinkUnspec::new_with_index(idx).controller(br).up().build())
            .execute()
            .await
            .map_err(|e| NetError::netlink(format!("bridge port {what}"), e))?;
    }
    s.link()
        .set(LinkUnspec::new_with_index(br).up().build())
        .execute()
        .await
        .map_err(|e| NetError::netlink("sandbox bridge up", e))?;
    Ok(())
}

/// Deletes a host link (and with it its peer). Absent links are fine.
pub async fn delete(ifname: &str) -> Result<(), NetError> {
    let ifname = ifname.to_string();
    on_thread(move || async move {
        let h = connect("host netlink socket")?;
        if let Some(idx) = index_of(&h, &ifname).await? {
            if let Err(e) = h.link().del(idx).execute().await {
                // Gone in between (its sandbox died): fine.
                if index_of(&h, &ifname).await?.is_some() {
                    return Err(NetError::netlink(format!("delete {ifname}"), e));
                }
            }
        }
        Ok(())
    })
    .await
}

/// Host IPv4 addresses inside `net/len`, as `address on interface`.
pub async fn addresses_in(net: Ipv4Addr, len: u8) -> Result<Vec<String>, NetError> {
    on_thread(move || async move {
        use rtnetlink::packet_route::address::AddressAttribute;
        let h = connect("host netlink socket")?;
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        };
        let inside = |a: Ipv4Addr| u32::from(a) & mask == u32::from(net) & mask;
        let mut names = std::collections::HashMap::new();
        let mut links = h.link().get().execute();
        while let Some(m) = links
            .try_next()
            .await
            .map_err(|e| NetError::netlink("list links", e))?
        {
            for a in &m.attributes {
                if let LinkAttribute::IfName(n) = a {
                    names.insert(m.header.index, n.clone());
                }
            }
        }
        let mut out = Vec::new();
        let mut addrs = h.address().get().execute();
        while let Some(m) = addrs
            .try_next()
            .await
            .map_err(|e| NetError::netlink("list addresses", e))?
        {
            for a in &m.attributes {
                if let AddressAttribute::Local(IpAddr::V4(v4))
                | AddressAttribute::Address(IpAddr::V4(v4)) = a
                {
                    if inside(*v4) {
                        let name = names
                            .get(&m.header.index)
                            .cloned()
                            .unwrap_or_else(|| format!("interface {}", m.header.index));
                        let line = format!("{v4} on {name}");
                        if !out.contains(&line) {
                            out.push(line);
                        }
                    }
                }
            }
        }
        Ok(out)
    })
    .await
}

/// Names of host links starting with `prefix`.
pub async fn list(prefix: &str) -> Result<Vec<String>, NetError> {
    let prefix = prefix.to_string();
    on_thread(move || async move {
        let h = connect("host netlink socket")?;
        let mut out = Vec::new();
        let mut links = h.link().get().execute();
        while let Some(m) = links
            .try_next()
            .await
            .map_err(|e| NetError::netlink("list links", e))?
        {
            for a in &m.attributes {
                if let LinkAttribute::IfName(n) = a {
                    if n.starts_with(&prefix) {
                        out.push(n.clone());
                    }
                }
            }
        }
        Ok(out)
    })
    .await
}
