//! Network policy of a sandbox: what it may reach beyond its own loopback.
//!
//! `none` (the default) leaves only loopback. `allow` opens exactly what is listed: raw
//! CIDR/port/protocol rules, named services of the node's configuration (`{"pypi": true}`),
//! and domain names answered by the sandbox's own resolver. Everything else stays closed.
//! This module owns the shape and the syntax rules; the node checks service names against
//! its configuration.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::error::ApiError;

/// Most raw allow rules in one policy.
pub const MAX_ALLOW_RULES: usize = 256;
/// Most domain names in one policy.
pub const MAX_DOMAINS: usize = 256;
/// Most named services in one policy.
pub const MAX_SERVICES: usize = 64;

/// `none` (loopback only) or `allow` (what the policy lists, nothing else).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    #[default]
    None,
    Allow,
}

/// Transport protocol of an allow rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    Tcp,
    Udp,
    /// TCP and UDP.
    #[default]
    Any,
}

impl Protocol {
    /// The IP protocols this stands for.
    pub fn expand(self) -> &'static [Protocol] {
        match self {
            Protocol::Tcp => &[Protocol::Tcp],
            Protocol::Udp => &[Protocol::Udp],
            Protocol::Any => &[Protocol::Tcp, Protocol::Udp],
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Any => "any",
        }
    }
}

/// Destination ports: one port (`443`), a range (`"8000-8100"`) or every port (`"any"`,
/// the default). JSON takes a number or a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ports {
    #[default]
    Any,
    /// Inclusive range; a single port is `lo == hi`.
    Range(u16, u16),
}

impl Ports {
    /// Inclusive bounds.
    pub fn bounds(self) -> (u16, u16) {
        match self {
            Ports::Any => (0, 65535),
            Ports::Range(a, b) => (a, b),
        }
    }

    /// Parses `443`, `"8000-8100"`, `"any"` or `"*"`.
    pub fn parse(s: &str) -> Result<Ports, AddressError> {
        let s = s.trim();
        if s == "any" || s == "*" {
            return Ok(Ports::Any);
        }
        let port = |p: &str| -> Result<u16, AddressError> {
            match p.trim().parse::<u16>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(AddressError::Ports(s.to_string())),
            }
        };
        match s.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (port(a)?, port(b)?);
                if a > b {
                    return Err(AddressError::Reversed(s.to_string()));
                }
                Ok(Ports::Range(a, b))
            }
            None => {
                let p = port(s)?;
                Ok(Ports::Range(p, p))
            }
        }
    }
}

/// Why ports or a network were refused (the message says what is expected).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("ports must be 1-65535, a range \"lo-hi\" or \"any\"; got {0:?}")]
    Ports(String),
    #[error("port range {0:?} is reversed")]
    Reversed(String),
    #[error("cidr {0:?}: only IPv4 networks are supported")]
    NotIpv4(String),
    #[error("cidr {0:?} is not an IPv4 network like 10.1.0.0/16")]
    Cidr(String),
    #[error("cidr {0:?}: prefix length must be 0-32")]
    Prefix(String),
}

impl std::fmt::Display for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ports::Any => f.write_str("any"),
            Ports::Range(a, b) if a == b => write!(f, "{a}"),
            Ports::Range(a, b) => write!(f, "{a}-{b}"),
        }
    }
}

impl Serialize for Ports {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Ports::Range(a, b) if a == b => s.serialize_u16(*a),
            other => s.serialize_str(&other.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Ports {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(i64),
            S(String),
        }
        let raw = Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("ports must be a number, a range \"lo-hi\" or \"any\"")
        })?;
        match raw {
            Raw::N(n) => Ports::parse(&n.to_string()),
            Raw::S(s) => Ports::parse(&s),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// One raw allow rule: destination network, ports, protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowRule {
    /// IPv4 network (`"10.1.0.0/16"`) or address (`"10.1.2.3"`).
    pub cidr: String,
    #[serde(default)]
    pub ports: Ports,
    #[serde(default)]
    pub protocol: Protocol,
}

impl AllowRule {
    /// The network as (first address, prefix length), host bits cleared.
    pub fn net(&self) -> Result<(Ipv4Addr, u8), ApiError> {
        parse_cidr(&self.cidr).map_err(|e| ApiError::invalid(e.to_string()))
    }
}

/// Parses an IPv4 CIDR or address into (network address, prefix length).
pub fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), AddressError> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, l),
        None => (s, "32"),
    };
    let ip: Ipv4Addr = addr.trim().parse().map_err(|_| {
        if addr.contains(':') {
            AddressError::NotIpv4(s.to_string())
        } else {
            AddressError::Cidr(s.to_string())
        }
    })?;
    let len: u8 = len
        .trim()
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| AddressError::Prefix(s.to_string()))?;
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    Ok((Ipv4Addr::from(u32::from(ip) & mask), len))
}

/// The network policy of one sandbox. JSON: `"none"`, or an object
/// `{"mode": "allow", "allow": [...], "services": {...}, "domains": [...]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    pub allow: Vec<AllowRule>,
    /// Named services of the node's configuration, on (`true`) or off.
    pub services: BTreeMap<String, bool>,
    /// Names the sandbox's resolver answers (`"files.example.test"`, `"*.example.test"`).
    pub domains: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyObject {
    #[serde(default)]
    mode: Option<NetworkMode>,
    #[serde(default)]
    allow: Vec<AllowRule>,
    #[serde(default)]
    services: BTreeMap<String, bool>,
    #[serde(default)]
    domains: Vec<String>,
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::String(s) if s == "none" => Ok(NetworkPolicy::none()),
            serde_json::Value::String(s) => Err(serde::de::Error::custom(format!(
                "network must be \"none\" or a policy object, got {s:?}"
            ))),
            serde_json::Value::Object(ref fields) if fields.get("mode").is_some_and(|m| m.is_null()) => {
                Err(serde::de::Error::custom(
                    "network: mode must be \"none\" or \"allow\" (leave it out to mean allow when rules are listed), not null",
                ))
            }
            serde_json::Value::Object(_) => {
                let o: PolicyObject = serde_json::from_value(v)
                    .map_err(|e| serde::de::Error::custom(format!("network: {e}")))?;
                // An object that lists something means `allow` unless it says otherwise.
                let listed = !o.allow.is_empty() || !o.services.is_empty() || !o.domains.is_empty();
                let mode = o.mode.unwrap_or(if listed {
                    NetworkMode::Allow
                } else {
                    NetworkMode::None
                });
                Ok(NetworkPolicy {
                    mode,
                    allow: o.allow,
                    services: o.services,
                    domains: o.domains,
                })
            }
            _ => Err(serde::de::Error::custom(
                "network must be \"none\" or a policy object",
            )),
        }
    }
}

impl NetworkPolicy {
    /// Loopback only.
    pub fn none() -> Self {
        NetworkPolicy::default()
    }

    /// True for `none`: no link, no resolver, no cost.
    pub fn is_none(&self) -> bool {
        self.mode == NetworkMode::None
    }

    /// Services switched on, by name.
    pub fn enabled_services(&self) -> impl Iterator<Item = &str> {
        self.services
            .iter()
            .filter(|(_, on)| **on)
            .map(|(k, _)| k.as_str())
    }

    /// Checks the syntax of every entry (service names are checked by the node).
    pub fn validate(&self) -> Result<(), ApiError> {
        if self.mode == NetworkMode::None
            && (!self.allow.is_empty() || !self.services.is_empty() || !self.domains.is_empty())
        {
            return Err(ApiError::invalid(
                "network mode \"none\" takes no allow rules, services or domains; use mode \"allow\"",
            ));
        }
        if self.allow.len() > MAX_ALLOW_RULES {
            return Err(ApiError::invalid(format!(
                "network: at most {MAX_ALLOW_RULES} allow rules"
            )));
        }
        if self.domains.len() > MAX_DOMAINS {
            return Err(ApiError::invalid(format!(
                "network: at most {MAX_DOMAINS} domains"
            )));
        }
        if self.services.len() > MAX_SERVICES {
            return Err(ApiError::invalid(format!(
                "network: at most {MAX_SERVICES} services"
            )));
        }
        for r in &self.allow {
            r.net()
                .map_err(|e| ApiError::invalid(format!("network.allow: {}", e.message)))?;
        }
        for s in self.services.keys() {
            service_name(s)?;
        }
        for d in &self.domains {
            domain_pattern(d)?;
        }
        Ok(())
    }
}

/// `GET/PUT /v1/sandboxes/{id}/network`: the policy in force and the sandbox's link.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkStatus {
    pub policy: NetworkPolicy,
    /// The sandbox's `eth0` address, when it has a link (policy not `none`).
    pub address: Option<String>,
    /// Its gateway, which is also its resolver.
    pub gateway: Option<String>,
}

/// A service name: 1-63 of `[a-z0-9_-]`.
pub fn service_name(s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "network: service name {s:?} must be 1-63 characters of a-z, 0-9, '-', '_'"
        )))
    }
}

/// A domain name (`files.example.test`) or a wildcard over its subdomains
/// (`*.example.test`); lower case, no trailing dot.
pub fn domain_pattern(s: &str) -> Result<(), ApiError> {
    let name = s.strip_prefix("*.").unwrap_or(s);
    let bad = || {
        ApiError::invalid(format!(
            "network: domain {s:?} must be a lower-case DNS name like files.example.test or *.example.test"
        ))
    };
    if name.is_empty() || name.len() > 253 || !name.contains('.') {
        return Err(bad());
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}

/// True when `name` (lower case, no trailing dot) is matched by `pattern`.
pub fn domain_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name.len() > suffix.len() + 1 && name.ends_with(&format!(".{suffix}")),
        None => pattern == name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(json: &str) -> Result<NetworkPolicy, String> {
        let p: NetworkPolicy = serde_json::from_str(json).map_err(|e| e.to_string())?;
        p.validate().map_err(|e| e.to_string())?;
        Ok(p)
    }

    #[test]
    fn none_in_both_spellings() {
        assert!(p(r#""none""#).unwrap().is_none());
        assert!(p(r#"{"mode":"none"}"#).unwrap().is_none());
        // A mode given as null is no mode at all: refused, not read as "allow".
        assert!(p(r#"{"mode":null,"services":{"pypi":true}}"#).is_err());
        assert!(p(r#"{}"#).unwrap().is_none());
        let s = serde_json::to_string(&NetworkPolicy::none()).unwrap();
        assert_eq!(
            s,
            r#"{"mode":"none","allow":[],"services":{},"domains":[]}"#
        );
    }

    #[test]
    fn allow_policies_parse() {
        let pol = p(r#"{"allow":[{"cidr":"10.254.1.9/24","ports":443,"protocol":"tcp"},
            {"cidr":"10.254.2.1","ports":"8000-8100"},{"cidr":"10.3.0.0/16"}],
            "services":{"pypi":true,"npm":false},"domains":["files.example.test","*.mirror.test"]}"#)
        .unwrap();
        assert_eq!(pol.mode, NetworkMode::Allow);
        assert_eq!(
            pol.allow[0].net().unwrap(),
            ("10.254.1.0".parse().unwrap(), 24)
        );
        assert_eq!(pol.allow[0].ports, Ports::Range(443, 443));
        assert_eq!(pol.allow[1].ports, Ports::Range(8000, 8100));
        assert_eq!(pol.allow[2].ports, Ports::Any);
        assert_eq!(pol.allow[2].protocol, Protocol::Any);
        assert_eq!(pol.enabled_services().collect::<Vec<_>>(), ["pypi"]);
        let back: NetworkPolicy =
            serde_json::from_str(&serde_json::to_string(&pol).unwrap()).unwrap();
        assert_eq!(back, pol);
    }

    #[test]
    fn bad_policies_are_refused_with_a_reason() {
        for (bad, why) in [
            (r#""host""#, "must be \"none\""),
            (r#""allow""#, "must be \"none\""),
            (r#"{"mode":"open"}"#, "unknown variant"),
            (r#"{"bogus":1}"#, "unknown field"),
            (r#"{"mode":"none","domains":["a.test"]}"#, "takes no allow"),
            (r#"{"allow":[{"cidr":"10.0.0.0/33"}]}"#, "prefix length"),
            (r#"{"allow":[{"cidr":"fd00::/8"}]}"#, "only IPv4"),
            (r#"{"allow":[{"cidr":"example.test"}]}"#, "not an IPv4"),
            (r#"{"allow":[{"cidr":"10.0.0.1","ports":0}]}"#, "ports must"),
            (
                r#"{"allow":[{"cidr":"10.0.0.1","ports":70000}]}"#,
                "ports must",
            ),
            (
                r#"{"allow":[{"cidr":"10.0.0.1","ports":"9-3"}]}"#,
                "reversed",
            ),
            (
                r#"{"allow":[{"cidr":"10.0.0.1","protocol":"icmp"}]}"#,
                "unknown variant",
            ),
            (r#"{"services":{"Py Pi":true}}"#, "service name"),
            (r#"{"domains":["Example.test"]}"#, "domain"),
            (r#"{"domains":["localhost"]}"#, "domain"),
            (r#"{"domains":["a..test"]}"#, "domain"),
            (r#"{"domains":["*"]}"#, "domain"),
        ] {
            let e = p(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn domain_patterns_match() {
        assert!(domain_matches("a.test", "a.test"));
        assert!(!domain_matches("a.test", "b.a.test"));
        assert!(domain_matches("*.a.test", "b.a.test"));
        assert!(!domain_matches("*.a.test", "a.test"));
        assert!(!domain_matches("*.a.test", "ba.test"));
    }
}
