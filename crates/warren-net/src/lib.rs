//! Per-sandbox network policy (containers, and VMs through their VMM's namespace).
//!
//! Every container sandbox has its own network namespace with only `lo`. A sandbox whose
//! policy is `none` gets nothing else from this crate: no link, no rule, no resolver, no
//! cost. A sandbox with an `allow` policy gets:
//! - a veth pair (`link`): host end `<prefix><index>` with `<pool>+4*index+1/30`, sandbox end
//!   `eth0` with `+2/30` and a default route via the host end;
//! - its chain and sets in the node's nftables table (`rules`), updated in one atomic batch
//!   per policy change;
//! - its resolver (`resolver`) on the host end's address, port 53.
//!
//! [`Network`] owns all of that for one node. It never touches a sandbox's processes or
//! files (the node writes the sandbox's `/etc/resolv.conf`), and never touches tables or
//! links that are not its own.

mod config;
pub mod conntrack;
mod error;
pub mod link;
pub mod resolver;
pub mod rules;

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, RwLock};
use warren_types::network::{parse_cidr, NetworkPolicy, Ports};

pub use config::{default_pool, NetConfig, Service};
pub use error::{ConfigError, NetError, Unready};
use resolver::{Answers, Learn, NameRule, Resolver};
use rules::{Elem, LinkRules, Proto, Table};

/// Runs nft batches through libnftables (the library of the `nft` tool), one kept context.
struct NftRunner(Result<warren_sys::nft::Nft, warren_sys::nft::NftError>);

impl NftRunner {
    fn open() -> NftRunner {
        NftRunner(warren_sys::nft::Nft::open())
    }

    fn run(&mut self, batch: &str) -> Result<String, NetError> {
        match &mut self.0 {
            Ok(n) => n.run(batch).map_err(NetError::Nft),
            Err(e) => Err(NetError::NftMissing(e.clone())),
        }
    }
}

/// A sandbox's network namespace, held open by a descriptor: it stays reachable whatever
/// becomes of the process it was found through (a container's first agent stage, which made
/// it, exits once it has forked the sandbox's first process), and a recycled pid can never
/// point the link at another namespace.
#[derive(Debug, Clone)]
pub struct Netns(Arc<std::os::fd::OwnedFd>);

impl Netns {
    /// The network namespace process `pid` is in now.
    pub fn of_pid(pid: u32) -> Result<Netns, NetError> {
        std::fs::File::open(format!("/proc/{pid}/ns/net"))
            .map(|f| Netns(Arc::new(f.into())))
            .map_err(|e| NetError::Io {
                what: format!("open the network namespace of pid {pid}"),
                source: e,
            })
    }

    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.as_fd()
    }
}

/// What a sandbox's link looks like (for logs, the API and the sandbox's resolv.conf).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LinkInfo {
    /// Host end's interface name.
    pub ifname: String,
    /// Host end's address: the sandbox's gateway and resolver.
    pub gateway: Ipv4Addr,
    /// The sandbox's address on `eth0`.
    pub address: Ipv4Addr,
}

struct Link {
    rules: LinkRules,
    answers: Arc<Answers>,
    _resolver: Resolver,
}

/// Adds learnt addresses to one link's resolver set.
struct SetLearner {
    nft: Arc<Mutex<NftRunner>>,
    table: Table,
    index: u32,
}

impl Learn for SetLearner {
    fn learn(&self, addrs: &[Ipv4Addr], ttl: u32) -> Result<(), NetError> {
        let batch = self.table.learn(self.index, addrs, ttl);
        self.nft.lock().expect("nft lock").run(&batch).map(|_| ())
    }
}

/// The network side of one node: its nftables table, address pool, links and resolvers.
pub struct Network {
    cfg: NetConfig,
    table: Table,
    pool_base: u32,
    pool_links: u32,
    nft: Arc<Mutex<NftRunner>>,
    links: Mutex<HashMap<String, Link>>,
    /// Link indexes taken by [`Network::reserve`] for sandboxes still starting.
    reserved: Mutex<HashMap<String, u32>>,
    used: Mutex<BTreeSet<u32>>,
    /// Link indexes whose address may still have tracked flows (forgetting them failed):
    /// kept out of [`Network::alloc`] until a later attempt succeeds, so no sandbox is given
    /// an address another sandbox's flows still reach.
    dirty: Mutex<BTreeSet<u32>>,
    /// Why this kernel's tracked flows cannot be forgotten (no ctnetlink), found at
    /// [`Network::start`]: then a freed address is reused with whatever flows it has left.
    conntrack_unsupported: Mutex<Option<String>>,
    /// Ok once [`Network::start`] cleaned up; until then (or after a failed start) policies
    /// are refused.
    ready: RwLock<Result<(), Unready>>,
    /// True once the node's table exists.
    table_made: Mutex<bool>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("table", &self.table.name)
            .field("pool", &self.table.pool)
            .finish()
    }
}

/// FNV-1a, for a short stable tag of the node id in interface names.
fn tag(node: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in node.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    format!("{:04x}", h & 0xffff)
}

impl Network {
    /// The network of node `node`. Touches nothing on the host until [`Network::start`].
    pub fn new(node: &str, cfg: NetConfig) -> Result<Network, NetError> {
        let err = |source| NetError::Config {
            path: "(network config)".into(),
            source,
        };
        cfg.check().map_err(err)?;
        let (net, len) = cfg.pool_net(node).map_err(err)?;
        let table = Table {
            name: format!("warren-{node}"),
            prefix: format!("wn{}", tag(node)),
            pool: format!("{net}/{len}"),
            masquerade: cfg.masquerade,
        };
        Ok(Network {
            pool_base: u32::from(net),
            pool_links: (1u32 << (32 - u32::from(len))) / 4,
            table,
            cfg,
            nft: Arc::new(Mutex::new(NftRunner::open())),
            links: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
            used: Mutex::new(BTreeSet::new()),
            dirty: Mutex::new(BTreeSet::new()),
            conntrack_unsupported: Mutex::new(None),
            ready: RwLock::new(Err(Unready::NotStarted)),
            table_made: Mutex::new(false),
        })
    }

    /// The pool's prefix length.
    fn pool_len(&self) -> u8 {
        (32 - (self.pool_links * 4).trailing_zeros()) as u8
    }

    /// Interface name prefix of this node's links.
    /// The names of the node's configured services.
    pub fn service_names(&self) -> Vec<String> {
        self.cfg.services.keys().cloned().collect()
    }

    pub fn link_prefix(&self) -> &str {
        &self.table.prefix
    }

    /// Removes whatever an earlier run of this node left (links, table) and installs a fresh
    /// table. Returns what was removed; a failure is kept as the reason policies are refused.
    pub async fn start(&self) -> Result<Vec<String>, Arc<NetError>> {
        let mut removed = Vec::new();
        let res = async {
            for l in link::list(&self.table.prefix).await? {
                link::delete(&l).await?;
                removed.push(format!("link {l}"));
            }
            // Our own links are gone: any address left in the pool is someone else's (another
            // daemon's links, a host network), and sharing it would break both.
            let taken = link::addresses_in(Ipv4Addr::from(self.pool_base), self.pool_len()).await?;
            if !taken.is_empty() {
                return Err(NetError::PoolInUse {
                    pool: self.table.pool.clone(),
                    taken,
                });
            }
            // Flows of the pool's addresses that an earlier run left: the addresses go to new
            // sandboxes (adopted ones get new links too).
            let net = Ipv4Addr::from(self.pool_base);
            let len = self.pool_len();
            let forgot = tokio::task::spawn_blocking(move || conntrack::forget(net, len))
                .await
                .map_err(|e| NetError::netlink("conntrack task", e))?;
            let mut unsupported = self.conntrack_unsupported.lock().expect("conntrack lock");
            match forgot {
                Ok(n) => {
                    *unsupported = None;
                    if n > 0 {
                        removed.push(format!("{n} tracked flows of the pool"));
                    }
                }
                Err(e @ NetError::ConntrackUnsupported(_)) => {
                    tracing::error!(error = %e, "flows of a deleted sandbox cannot be forgotten: a peer that goes on sending to a sandbox's address may reach the next sandbox given that address until the flow times out");
                    *unsupported = Some(e.to_string());
                }
                Err(e) => return Err(e),
            }
            drop(unsupported);
            self.dirty.lock().expect("dirty lock").clear();
            // The table itself is made by the first link: a node that never gives a sandbox a
            // network leaves no trace in the host's ruleset.
            if self.run(&self.table.exists_cmd()).is_ok() {
                self.run(&self.table.delete())?;
                removed.push(format!("nftables table {}", self.table.name));
            }
            *self.table_made.lock().expect("table lock") = false;
            Ok(())
        }
        .await;
        let res = res.map_err(Arc::new);
        *self.ready.write().expect("ready lock") = res
            .as_ref()
            .map(|_| ())
            .map_err(|e| Unready::StartFailed(e.clone()));
        res.map(|_| removed)
    }

    /// Removes every link of this node and its table (sandboxes keep only loopback until a
    /// later start attaches them again).
    pub async fn shutdown(&self) {
        let links: Vec<String> = {
            let mut map = self.links.lock().expect("links lock");
            let names = map.values().map(|l| l.rules.ifname.clone()).collect();
            map.clear();
            names
        };
        for l in links {
            if let Err(e) = link::delete(&l).await {
                tracing::warn!(link = l, error = %e, "cannot remove a sandbox link");
            }
        }
        let mut made = self.table_made.lock().expect("table lock");
        if *made {
            if let Err(e) = self.run(&self.table.delete()) {
                tracing::warn!(table = self.table.name, error = %e, "cannot remove the nftables table");
            }
            *made = false;
        }
        drop(made);
        self.used.lock().expect("used lock").clear();
        *self.ready.write().expect("ready lock") = Err(Unready::ShutDown);
    }

    fn run(&self, batch: &str) -> Result<String, NetError> {
        self.nft.lock().expect("nft lock").run(batch)
    }

    /// Checks a policy against this node (known services, network available).
    pub fn check(&self, policy: &NetworkPolicy) -> Result<(), NetError> {
        if policy.is_none() {
            return Ok(());
        }
        if let Err(e) = &*self.ready.read().expect("ready lock") {
            return Err(NetError::Policy(format!(
                "network policies are unavailable on this node: {e}"
            )));
        }
        for s in policy.services.keys() {
            if !self.cfg.services.contains_key(s) {
                let known: Vec<&str> = self.cfg.services.keys().map(String::as_str).collect();
                return Err(NetError::Policy(format!(
                    "network: unknown service {s:?}; this node offers: {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )));
            }
        }
        Ok(())
    }

    /// The allow elements of a policy.
    fn elements(&self, policy: &NetworkPolicy) -> Result<Vec<Elem>, NetError> {
        let mut out = Vec::new();
        let mut push = |cidr: &str, ports: Ports, protos: Vec<Proto>| -> Result<(), NetError> {
            let (net, len) = parse_cidr(cidr).map_err(|e| NetError::Policy(e.to_string()))?;
            let (lo, hi) = ports.bounds();
            for proto in protos {
                out.push(Elem {
                    net: u32::from(net),
                    len,
                    proto,
                    lo,
                    hi,
                });
            }
            Ok(())
        };
        for r in &policy.allow {
            push(&r.cidr, r.ports, Proto::from_policy(r.protocol))?;
        }
        for name in policy.enabled_services() {
            let s = &self.cfg.services[name];
            let ports = if s.ports.is_empty() {
                vec![Ports::Any]
            } else {
                s.ports.clone()
            };
            for c in &s.cidrs {
                for p in &ports {
                    push(c, *p, Proto::from_policy(s.protocol))?;
                }
            }
        }
        Ok(out)
    }

    /// Names the resolver answers under a policy.
    fn allowed_names(&self, policy: &NetworkPolicy) -> Vec<NameRule> {
        let mut names: Vec<NameRule> = policy
            .domains
            .iter()
            .map(|d| NameRule {
                pattern: d.clone(),
                covered: Vec::new(),
            })
            .collect();
        for s in policy.enabled_services() {
            let svc = &self.cfg.services[s];
            let covered: Vec<(Ipv4Addr, u8)> = svc
                .cidrs
                .iter()
                .filter_map(|c| parse_cidr(c).ok())
                .collect();
            names.extend(svc.hostnames.iter().map(|h| NameRule {
                pattern: h.clone(),
                covered: covered.clone(),
            }));
        }
        names
    }

    fn alloc(&self) -> Result<u32, NetError> {
        let mut used = self.used.lock().expect("used lock");
        let dirty = self.dirty.lock().expect("dirty lock");
        let free = (0..self.pool_links).find(|i| !used.contains(i) && !dirty.contains(i));
        drop(dirty);
        let Some(i) = free else {
            return Err(NetError::PoolExhausted {
                pool: self.table.pool.clone(),
                links: self.pool_links,
            });
        };
        used.insert(i);
        Ok(i)
    }

    fn free(&self, i: u32) {
        self.used.lock().expect("used lock").remove(&i);
    }

    /// The addresses sandbox `id`'s link will have, taken now (before the sandbox exists) so
    /// that its `/etc/resolv.conf` can be written while it starts instead of after; the link
    /// itself comes with [`Network::apply`]. [`Network::detach`] gives a reservation back.
    pub fn reserve(&self, id: &str, policy: &NetworkPolicy) -> Result<LinkInfo, NetError> {
        self.check(policy)?;
        let index = match self.reserved.lock().expect("reserved lock").get(id) {
            Some(&i) => i,
            None => self.alloc()?,
        };
        self.reserved
            .lock()
            .expect("reserved lock")
            .insert(id.to_string(), index);
        Ok(self.link_info(index))
    }

    fn link_info(&self, index: u32) -> LinkInfo {
        let base = self.pool_base + index * 4;
        LinkInfo {
            ifname: format!("{}{index:x}", self.table.prefix),
            gateway: Ipv4Addr::from(base + 1),
            address: Ipv4Addr::from(base + 2),
        }
    }

    /// The link of a sandbox, if it has one.
    pub fn link_of(&self, id: &str) -> Option<LinkInfo> {
        self.links
            .lock()
            .expect("links lock")
            .get(id)
            .map(|l| LinkInfo {
                ifname: l.rules.ifname.clone(),
                gateway: l.rules.host,
                address: l.rules.peer,
            })
    }

    /// Applies `policy` to sandbox `id` whose network namespace is `netns`: creates,
    /// updates or removes its link. With `tap` (a VM sandbox), the link is bridged to that
    /// tap of the namespace and the guest takes the address. Returns the link, if the
    /// sandbox has one afterwards.
    pub async fn apply(
        &self,
        id: &str,
        netns: &Netns,
        tap: Option<&str>,
        policy: &NetworkPolicy,
    ) -> Result<Option<LinkInfo>, NetError> {
        self.check(policy)?;
        let has = self.links.lock().expect("links lock").contains_key(id);
        match (has, policy.is_none()) {
            (false, true) => Ok(None),
            (true, true) => {
                self.detach(id).await?;
                Ok(None)
            }
            (false, false) => self.attach(id, netns, tap, policy).await.map(Some),
            (true, false) => self.update(id, policy).map(|_| self.link_of(id)),
        }
    }

    async fn attach(
        &self,
        id: &str,
        netns: &Netns,
        tap: Option<&str>,
        policy: &NetworkPolicy,
    ) -> Result<LinkInfo, NetError> {
        let t0 = std::time::Instant::now();
        let layers = rules::layers(self.elements(policy)?);
        let reserved = self.reserved.lock().expect("reserved lock").remove(id);
        let index = match reserved {
            Some(i) => i,
            None => self.alloc()?,
        };
        let planned = self.link_info(index);
        let rules = LinkRules {
            index,
            ifname: planned.ifname,
            host: planned.gateway,
            peer: planned.address,
            layers,
        };
        let fail = |e: NetError| async {
            let _ = link::delete(&rules.ifname).await;
            self.dirty.lock().expect("dirty lock").insert(index);
            self.free(index);
            let _ = self.forget_dirty().await;
            Err(e)
        };
        // The link is made on a thread of its own while the rules go in here once the node's
        // table exists: until both are there, the base chains drop whatever the link sends
        // (it is in neither map yet). The first link waits for the table.
        let spawn_link = || {
            tokio::spawn(link::create(
                rules.ifname.clone(),
                netns.clone(),
                rules.host,
                rules.peer,
                tap.map(str::to_string),
            ))
        };
        let early = (*self.table_made.lock().expect("table lock")).then(spawn_link);
        let added = {
            // Held across the batch: two first links must not both (re)create the table.
            let mut made = self.table_made.lock().expect("table lock");
            let batch = if *made {
                self.table.add_link(&rules)
            } else {
                self.table.create() + &self.table.add_link(&rules)
            };
            let r = self.run(&batch);
            if r.is_ok() {
                *made = true;
            }
            r
        };
        if let Err(e) = added {
            if let Some(h) = early {
                let _ = h.await;
            }
            return fail(e).await;
        }
        let t_rules = t0.elapsed();
        let made = async {
            early
                .unwrap_or_else(spawn_link)
                .await
                .unwrap_or_else(|e| Err(NetError::netlink("link task", e)))
        };
        let undo_rules = |e: NetError| {
            let _ = self.run(&self.table.remove_link(&rules));
            e
        };
        if let Err(e) = made.await {
            return fail(undo_rules(e)).await;
        }
        let t_link = t0.elapsed();
        if let Err(e) = enable_forwarding() {
            return fail(undo_rules(e)).await;
        }
        let answers = Arc::new(Answers {
            allowed: RwLock::new(self.allowed_names(policy)),
            hosts: self.cfg.hosts.clone(),
            hosts_ttl: self.cfg.hosts_ttl,
            upstream: self.cfg.upstream,
            learn: Box::new(SetLearner {
                nft: self.nft.clone(),
                table: self.table.clone(),
                index,
            }),
        });
        let resolver = match Resolver::start(rules.host, answers.clone()).await {
            Ok(r) => r,
            Err(e) => return fail(undo_rules(e)).await,
        };
        tracing::debug!(
            sandbox = id,
            rules_us = t_rules.as_micros() as u64,
            link_us = t_link.as_micros() as u64,
            total_us = t0.elapsed().as_micros() as u64,
            "sandbox link attached"
        );
        let info = LinkInfo {
            ifname: rules.ifname.clone(),
            gateway: rules.host,
            address: rules.peer,
        };
        self.links.lock().expect("links lock").insert(
            id.to_string(),
            Link {
                rules,
                answers,
                _resolver: resolver,
            },
        );
        Ok(info)
    }

    /// Swaps a link's rules in one batch and the resolver's names.
    fn update(&self, id: &str, policy: &NetworkPolicy) -> Result<(), NetError> {
        let layers = rules::layers(self.elements(policy)?);
        let mut links = self.links.lock().expect("links lock");
        let Some(l) = links.get_mut(id) else {
            return Ok(());
        };
        let mut next = l.rules.clone();
        next.layers = layers;
        let batch = self.table.remove_link(&l.rules) + &self.table.add_link(&next);
        self.run(&batch)?;
        l.rules = next;
        *l.answers.allowed.write().expect("resolver lock") = self.allowed_names(policy);
        Ok(())
    }

    /// Removes a sandbox's link, rules and resolver. Nothing to do for a sandbox without one.
    pub async fn detach(&self, id: &str) -> Result<(), NetError> {
        if let Some(i) = self.reserved.lock().expect("reserved lock").remove(id) {
            self.free(i);
        }
        let Some(l) = self.links.lock().expect("links lock").remove(id) else {
            return Ok(());
        };
        let index = l.rules.index;
        let res = self.run(&self.table.remove_link(&l.rules));
        drop(l._resolver);
        let del = link::delete(&l.rules.ifname).await;
        // The address goes back to the pool only once no tracked flow names it: until then a
        // peer's packets of this sandbox's flows would reach the next sandbox given it.
        self.dirty.lock().expect("dirty lock").insert(index);
        self.free(index);
        let forgot = self.forget_dirty().await;
        res.and(del).and(forgot)
    }

    /// Forgets the tracked flows of every link address whose flows may remain, and gives
    /// the addresses whose flows are gone back to the pool.
    async fn forget_dirty(&self) -> Result<(), NetError> {
        if self
            .conntrack_unsupported
            .lock()
            .expect("conntrack lock")
            .is_some()
        {
            // Said once at start: nothing to wait for, the addresses go back as they are.
            self.dirty.lock().expect("dirty lock").clear();
            return Ok(());
        }
        let dirty: Vec<u32> = self
            .dirty
            .lock()
            .expect("dirty lock")
            .iter()
            .copied()
            .collect();
        for index in dirty {
            let addr = self.link_info(index).address;
            let res = tokio::task::spawn_blocking(move || conntrack::forget(addr, 32))
                .await
                .map_err(|e| NetError::netlink("conntrack task", e))
                .and_then(|r| r);
            match res {
                Ok(n) => {
                    self.dirty.lock().expect("dirty lock").remove(&index);
                    tracing::debug!(address = %addr, flows = n, "forgot the flows of a link address");
                }
                Err(e) => {
                    tracing::warn!(address = %addr, error = %e, "cannot forget the tracked flows of a link address: it is not given to another sandbox until they are");
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Sandboxes that have a link.
    pub fn attached(&self) -> Vec<String> {
        self.links
            .lock()
            .expect("links lock")
            .keys()
            .cloned()
            .collect()
    }
}

/// Turns on IPv4 forwarding (needed to route sandbox links); logs the first time it does.
fn enable_forwarding() -> Result<(), NetError> {
    const P: &str = "/proc/sys/net/ipv4/ip_forward";
    let cur = std::fs::read_to_string(P).unwrap_or_default();
    if cur.trim() == "1" {
        return Ok(());
    }
    std::fs::write(P, "1").map_err(|e| NetError::Io {
        what: "enable net.ipv4.ip_forward".into(),
        source: e,
    })?;
    tracing::info!("enabled net.ipv4.ip_forward for sandbox links (forwarding of other interfaces is left to the host's own firewall)");
    Ok(())
}

/// The `/etc/resolv.conf` a sandbox gets with a link.
pub fn resolv_conf(link: Option<&LinkInfo>) -> String {
    match link {
        Some(l) => format!(
            "# written by warren: the sandbox's own resolver\nnameserver {}\noptions timeout:1 attempts:2\n",
            l.gateway
        ),
        None => "# no network by default\n".to_string(),
    }
}
