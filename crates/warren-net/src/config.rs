//! The node's network configuration: named services, static host entries, the address pool
//! of sandbox links and the upstream resolver. Read from a TOML or JSON file
//! (`warrend --network-config FILE`):
//!
//! ```toml
//! pool = "10.200.0.0/16"          # one /30 per sandbox link (default: by node id)
//! upstream = "10.254.0.53:53"      # optional: names not in [hosts] are asked here
//! masquerade = true                # NAT allowed traffic behind the host's address
//!
//! [services.pypi]
//! cidrs = ["10.254.1.2/32"]
//! ports = [443, "8000-8100"]
//! protocol = "tcp"
//! hostnames = ["pypi.mirror.test"]
//!
//! [hosts]
//! "pypi.mirror.test" = ["10.254.1.2"]
//! ```

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use warren_types::network::{domain_pattern, parse_cidr, service_name, Ports, Protocol};

use crate::{ConfigError, NetError};

/// A named service a policy can switch on.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Networks of the service (IPv4 CIDRs or addresses).
    #[serde(default)]
    pub cidrs: Vec<String>,
    /// Ports opened on those networks (default: any).
    #[serde(default)]
    pub ports: Vec<Ports>,
    #[serde(default)]
    pub protocol: Protocol,
    /// Names the sandbox's resolver answers when the service is on.
    #[serde(default)]
    pub hostnames: Vec<String>,
}

/// The node's network settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetConfig {
    /// IPv4 pool the sandbox links take their /30 from. Default: one of the /16s
    /// 10.202.0.0-10.249.0.0 picked by the node id ([`default_pool`]), so daemons of different
    /// nodes on one host rarely share one (and a start that finds its pool in use says so).
    #[serde(default)]
    pub pool: Option<String>,
    /// Resolver asked for allowed names that are not in `hosts`.
    #[serde(default)]
    pub upstream: Option<SocketAddr>,
    /// Source-NAT allowed traffic leaving the node (off: the peers must route the pool back).
    #[serde(default = "yes")]
    pub masquerade: bool,
    /// TTL (seconds) of answers from `hosts`.
    #[serde(default = "default_ttl")]
    pub hosts_ttl: u32,
    #[serde(default)]
    pub services: BTreeMap<String, Service>,
    /// Static answers: name → IPv4 addresses.
    #[serde(default)]
    pub hosts: BTreeMap<String, Vec<Ipv4Addr>>,
}

/// The default pool of `node`: `10.(202 + h % 48).0.0/16`, `h` a hash (FNV-1a) of the node id.
pub fn default_pool(node: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in node.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x01000193);
    }
    format!("10.{}.0.0/16", 202 + h % 48)
}
fn yes() -> bool {
    true
}
fn default_ttl() -> u32 {
    300
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            pool: None,
            upstream: None,
            masquerade: true,
            hosts_ttl: default_ttl(),
            services: BTreeMap::new(),
            hosts: BTreeMap::new(),
        }
    }
}

impl NetConfig {
    /// Reads a `.json` file as JSON, anything else as TOML, and checks it.
    pub fn load(path: &std::path::Path) -> Result<NetConfig, NetError> {
        let err = |source: ConfigError| NetError::Config {
            path: path.display().to_string(),
            source,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(ConfigError::Read(e)))?;
        let cfg: NetConfig = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| err(ConfigError::Json(e)))?
        } else {
            toml::from_str(&text).map_err(|e| err(ConfigError::Toml(e)))?
        };
        cfg.check().map_err(err)?;
        Ok(cfg)
    }

    /// The pool of node `node`: the configured one, else its default.
    pub fn pool_for(&self, node: &str) -> String {
        self.pool.clone().unwrap_or_else(|| default_pool(node))
    }

    /// Checks names, networks and the pool.
    pub fn check(&self) -> Result<(), ConfigError> {
        if let Some(pool) = &self.pool {
            let (_, len) = parse_cidr(pool).map_err(ConfigError::Pool)?;
            if len > 28 {
                return Err(ConfigError::PoolTooSmall { pool: pool.clone() });
            }
        }
        for (name, s) in &self.services {
            service_name(name).map_err(|e| ConfigError::ServiceName {
                name: name.clone(),
                message: e.message,
            })?;
            for c in &s.cidrs {
                parse_cidr(c).map_err(|source| ConfigError::ServiceNetwork {
                    service: name.clone(),
                    source,
                })?;
            }
            for h in &s.hostnames {
                domain_pattern(h).map_err(|e| ConfigError::ServiceHostname {
                    service: name.clone(),
                    hostname: h.clone(),
                    message: e.message,
                })?;
            }
        }
        for name in self.hosts.keys() {
            domain_pattern(name).map_err(|e| ConfigError::HostName {
                name: name.clone(),
                message: e.message,
            })?;
        }
        Ok(())
    }

    /// Node `node`'s pool as (network, prefix length).
    pub fn pool_net(&self, node: &str) -> Result<(Ipv4Addr, u8), ConfigError> {
        parse_cidr(&self.pool_for(node)).map_err(ConfigError::Pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_json_configs_load() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("net.toml");
        std::fs::write(
            &t,
            r#"
pool = "10.201.0.0/16"
upstream = "10.254.0.53:53"
[services.pypi]
cidrs = ["10.254.1.2/32"]
ports = [443, "8000-8100"]
protocol = "tcp"
hostnames = ["pypi.mirror.test"]
[hosts]
"pypi.mirror.test" = ["10.254.1.2"]
"#,
        )
        .unwrap();
        let c = NetConfig::load(&t).unwrap();
        assert_eq!(c.services["pypi"].ports[1], Ports::Range(8000, 8100));
        assert!(c.masquerade);
        let j = dir.path().join("net.json");
        std::fs::write(&j, r#"{"services":{"npm":{"cidrs":["10.254.2.0/24"]}}}"#).unwrap();
        let c = NetConfig::load(&j).unwrap();
        assert_eq!(c.pool, None);
        assert_eq!(c.pool_for("n1"), default_pool("n1"));
        assert_eq!(c.services["npm"].protocol, Protocol::Any);
    }

    #[test]
    fn the_shipped_example_loads() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs/examples/network.toml");
        let c = NetConfig::load(&p).unwrap();
        let pypi = &c.services["pypi"];
        assert!(pypi.hostnames.contains(&"pypi.org".to_string()));
        assert_eq!(pypi.protocol, Protocol::Tcp);
        assert_eq!(c.pool, None);
    }

    #[test]
    fn default_pools_follow_the_node_id() {
        let pools: std::collections::BTreeSet<String> = ["n1", "n2", "n3", "node7", "gpu01"]
            .iter()
            .map(|n| default_pool(n))
            .collect();
        assert!(pools.len() >= 4, "{pools:?}");
        for p in &pools {
            let (net, len) = parse_cidr(p).unwrap();
            let second = net.octets()[1];
            assert!(len == 16 && (202..250).contains(&second), "{p}");
        }
        assert_eq!(default_pool("n1"), default_pool("n1"));
        let fixed = NetConfig {
            pool: Some("10.9.0.0/16".into()),
            ..Default::default()
        };
        assert_eq!(fixed.pool_for("n1"), "10.9.0.0/16");
    }

    #[test]
    fn bad_configs_say_why() {
        let dir = tempfile::tempdir().unwrap();
        for (text, why) in [
            ("pool = \"10.0.0.0/30\"", "too small"),
            ("[services.Bad]\ncidrs=[]", "service name"),
            ("[services.a]\ncidrs=[\"x\"]", "not an IPv4"),
            ("bogus = 1", "unknown field"),
        ] {
            let p = dir.path().join("c.toml");
            std::fs::write(&p, text).unwrap();
            let e = NetConfig::load(&p).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
