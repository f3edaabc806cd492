//! The nftables text of the node's table and of each sandbox link.
//!
//! One table per node, `inet warren-<node>`. Its base chains only ever look at packets of
//! this node's links (interface names `<prefix>*`), so other tables and other daemons are
//! untouched. Per link `i`:
//! - chain `sb_i`: anti-spoofing (source must be the link's sandbox address), then the
//!   packets of established flows, then the allow sets `a<i>_<layer>` (`ipv4_addr .
//!   inet_proto . inet_service`, intervals), then the resolver's set `d<i>` (addresses learnt
//!   from allowed names, with their TTL), then drop;
//! - an element `"<ifname>" : jump sb_i` in the map `links` the forward chain dispatches on;
//! - an element `"<ifname>" . <host address>` in `dns`, the one thing input accepts;
//! - an element `"<ifname>" . <sandbox address>` in `srcs`, the only source input takes.
//!
//! Whatever comes from a link meets the link's own rules before any `established` shortcut:
//! a sandbox that forges a neighbour's address cannot ride the neighbour's flows. (Flows of
//! an address are forgotten before the address is reused, see `conntrack`.)
//!
//! Concatenated interval sets refuse overlapping elements, so a policy's elements are spread
//! over as few "layers" (sets) as needed, each free of overlaps. A policy change is one batch
//! (remove the link's objects, add them again), so it is atomic and applies to the next packet
//! that is not part of an established connection.

use std::net::Ipv4Addr;
use warren_types::network::Protocol;

/// One allow element: a network, a protocol (tcp or udp) and an inclusive port range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Elem {
    pub net: u32,
    pub len: u8,
    pub proto: Proto,
    pub lo: u16,
    pub hi: u16,
}

/// A concrete transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn from_policy(p: Protocol) -> Vec<Proto> {
        p.expand()
            .iter()
            .map(|p| match p {
                Protocol::Udp => Proto::Udp,
                _ => Proto::Tcp,
            })
            .collect()
    }
    fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

impl Elem {
    fn last(&self) -> u32 {
        self.net | u32::MAX.checked_shr(u32::from(self.len)).unwrap_or(0)
    }
    fn overlaps(&self, o: &Elem) -> bool {
        self.proto == o.proto
            && self.net <= o.last()
            && o.net <= self.last()
            && self.lo <= o.hi
            && o.lo <= self.hi
    }
    fn contains(&self, o: &Elem) -> bool {
        self.proto == o.proto
            && self.net <= o.net
            && o.last() <= self.last()
            && self.lo <= o.lo
            && o.hi <= self.hi
    }
    fn render(&self) -> String {
        let ports = if self.lo == self.hi {
            self.lo.to_string()
        } else {
            format!("{}-{}", self.lo, self.hi)
        };
        format!(
            "{}/{} . {} . {}",
            Ipv4Addr::from(self.net),
            self.len,
            self.proto.as_str(),
            ports
        )
    }
}

/// Spreads elements over overlap-free layers (elements inside another are dropped).
pub fn layers(mut elems: Vec<Elem>) -> Vec<Vec<Elem>> {
    // Widest first, so contained elements are seen after their container.
    elems.sort_by_key(|e| (e.len, std::cmp::Reverse(e.hi - e.lo), e.net, e.proto, e.lo));
    let mut kept: Vec<Elem> = Vec::new();
    for e in elems {
        if !kept.iter().any(|k| k.contains(&e)) {
            kept.push(e);
        }
    }
    let mut out: Vec<Vec<Elem>> = Vec::new();
    for e in kept {
        match out.iter_mut().find(|l| !l.iter().any(|k| k.overlaps(&e))) {
            Some(l) => l.push(e),
            None => out.push(vec![e]),
        }
    }
    out
}

/// Names shared by every rule of one node.
#[derive(Debug, Clone)]
pub struct Table {
    /// `warren-<node>`.
    pub name: String,
    /// Interface name prefix of this node's links.
    pub prefix: String,
    /// The sandbox address pool, `a.b.c.d/n`.
    pub pool: String,
    pub masquerade: bool,
}

/// One sandbox link as the rules see it.
#[derive(Debug, Clone)]
pub struct LinkRules {
    pub index: u32,
    pub ifname: String,
    pub host: Ipv4Addr,
    pub peer: Ipv4Addr,
    /// Allow layers (see [`layers`]).
    pub layers: Vec<Vec<Elem>>,
}

impl Table {
    /// Replaces the node's table with an empty one (no links).
    pub fn create(&self) -> String {
        let (t, p, pool) = (&self.name, &self.prefix, &self.pool);
        let nat = if self.masquerade {
            format!(
                "  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;\n    ip saddr {pool} oifname != \"{p}*\" masquerade\n  }}\n"
            )
        } else {
            String::new()
        };
        format!(
            "table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n\
  map links {{ type ifname : verdict; }}\n\
  set dns {{ type ifname . ipv4_addr; }}\n\
  set srcs {{ type ifname . ipv4_addr; }}\n\
  chain forward {{ type filter hook forward priority filter; policy accept;\n\
    iifname \"{p}*\" ip daddr {pool} drop\n\
    iifname \"{p}*\" iifname vmap @links\n\
    iifname \"{p}*\" drop\n\
    oifname \"{p}*\" ct state established,related accept\n\
    oifname \"{p}*\" drop\n\
  }}\n\
  chain input {{ type filter hook input priority filter; policy accept;\n\
    iifname \"{p}*\" meta nfproto != ipv4 drop\n\
    iifname \"{p}*\" iifname . ip saddr != @srcs drop\n\
    iifname \"{p}*\" ct state established,related accept\n\
    iifname \"{p}*\" meta l4proto {{ tcp, udp }} th dport 53 iifname . ip daddr @dns accept\n\
    iifname \"{p}*\" drop\n\
  }}\n{nat}}}\n"
        )
    }

    /// Succeeds only when the node's table exists.
    pub fn exists_cmd(&self) -> String {
        format!("list table inet {}\n", self.name)
    }

    /// Deletes the node's table (nothing if it is absent).
    pub fn delete(&self) -> String {
        format!("table inet {t}\ndelete table inet {t}\n", t = self.name)
    }

    /// Adds a link's chain, sets and map elements.
    pub fn add_link(&self, l: &LinkRules) -> String {
        let (t, i) = (&self.name, l.index);
        let mut s = String::new();
        for (n, layer) in l.layers.iter().enumerate() {
            s += &format!("add set inet {t} a{i}_{n} {{ type ipv4_addr . inet_proto . inet_service; flags interval; }}\n");
            if !layer.is_empty() {
                let elems: Vec<String> = layer.iter().map(Elem::render).collect();
                s += &format!("add element inet {t} a{i}_{n} {{ {} }}\n", elems.join(", "));
            }
        }
        s += &format!("add set inet {t} d{i} {{ type ipv4_addr; flags timeout; }}\n");
        s += &format!("add chain inet {t} sb_{i}\n");
        s += &format!("add rule inet {t} sb_{i} ip saddr != {} drop\n", l.peer);
        s += &format!("add rule inet {t} sb_{i} meta nfproto != ipv4 drop\n");
        // After the source check: a flow's packets pass only through the link they came
        // from, with that link's own address.
        s += &format!("add rule inet {t} sb_{i} ct state established,related accept\n");
        for n in 0..l.layers.len() {
            s += &format!(
                "add rule inet {t} sb_{i} ip daddr . meta l4proto . th dport @a{i}_{n} accept\n"
            );
        }
        s += &format!(
            "add rule inet {t} sb_{i} meta l4proto {{ tcp, udp }} ip daddr @d{i} accept\n"
        );
        s += &format!("add rule inet {t} sb_{i} drop\n");
        s += &format!(
            "add element inet {t} links {{ \"{}\" : jump sb_{i} }}\n",
            l.ifname
        );
        s += &format!(
            "add element inet {t} dns {{ \"{}\" . {} }}\n",
            l.ifname, l.host
        );
        s += &format!(
            "add element inet {t} srcs {{ \"{}\" . {} }}\n",
            l.ifname, l.peer
        );
        s
    }

    /// Removes a link's chain, sets and map elements (the inverse of [`Table::add_link`]).
    pub fn remove_link(&self, l: &LinkRules) -> String {
        let (t, i) = (&self.name, l.index);
        let mut s = format!("delete element inet {t} links {{ \"{}\" }}\n", l.ifname);
        s += &format!(
            "delete element inet {t} dns {{ \"{}\" . {} }}\n",
            l.ifname, l.host
        );
        s += &format!(
            "delete element inet {t} srcs {{ \"{}\" . {} }}\n",
            l.ifname, l.peer
        );
        s += &format!("flush chain inet {t} sb_{i}\ndelete chain inet {t} sb_{i}\n");
        for n in 0..l.layers.len() {
            s += &format!("delete set inet {t} a{i}_{n}\n");
        }
        s += &format!("delete set inet {t} d{i}\n");
        s
    }

    /// Adds resolved addresses to a link's resolver set for `ttl` seconds.
    pub fn learn(&self, index: u32, addrs: &[Ipv4Addr], ttl: u32) -> String {
        let elems: Vec<String> = addrs
            .iter()
            .map(|a| format!("{a} timeout {}s", ttl.max(1)))
            .collect();
        format!(
            "add element inet {} d{index} {{ {} }}\n",
            self.name,
            elems.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(net: &str, len: u8, proto: Proto, lo: u16, hi: u16) -> Elem {
        Elem {
            net: u32::from(net.parse::<Ipv4Addr>().unwrap()),
            len,
            proto,
            lo,
            hi,
        }
    }

    #[test]
    fn layers_have_no_overlaps_and_drop_contained_elements() {
        let all = vec![
            e("10.0.0.0", 8, Proto::Tcp, 0, 65535),
            e("10.1.0.0", 16, Proto::Tcp, 80, 80), // inside the first: dropped
            e("10.1.0.0", 16, Proto::Udp, 80, 90), // other protocol: same layer
            e("10.1.2.0", 24, Proto::Udp, 85, 100), // overlaps the udp one: new layer
            e("192.168.0.0", 16, Proto::Tcp, 443, 443),
            e("192.168.1.7", 32, Proto::Tcp, 80, 90), // host routes and /0 too
            e("192.168.1.7", 32, Proto::Tcp, 85, 85),
            e("0.0.0.0", 0, Proto::Udp, 53, 53),
        ];
        let ls = layers(all);
        assert_eq!(ls.len(), 2);
        assert_eq!(ls.iter().map(Vec::len).sum::<usize>(), 6);
        for l in &ls {
            for (i, a) in l.iter().enumerate() {
                for b in &l[i + 1..] {
                    assert!(!a.overlaps(b), "{a:?} {b:?}");
                }
            }
        }
    }

    #[test]
    fn link_rules_add_and_remove_the_same_objects() {
        let t = Table {
            name: "warren-n1".into(),
            prefix: "wnab12".into(),
            pool: "10.200.0.0/16".into(),
            masquerade: true,
        };
        assert!(t.create().contains("masquerade"));
        let l = LinkRules {
            index: 3,
            ifname: "wnab123".into(),
            host: "10.200.0.13".parse().unwrap(),
            peer: "10.200.0.14".parse().unwrap(),
            layers: vec![vec![e("10.254.1.0", 24, Proto::Tcp, 443, 443)]],
        };
        let add = t.add_link(&l);
        assert!(add.contains("add element inet warren-n1 a3_0 { 10.254.1.0/24 . tcp . 443 }"));
        assert!(add.contains("ip saddr != 10.200.0.14 drop"));
        let rm = t.remove_link(&l);
        for obj in ["sb_3", "a3_0", "d3", "links", "dns", "srcs"] {
            assert!(rm.contains(obj), "{obj}");
        }
        assert!(t
            .learn(3, &["10.254.1.5".parse().unwrap()], 0)
            .contains("timeout 1s"));
    }
}
