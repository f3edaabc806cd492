//! `warren net ID`: shows or replaces a sandbox's network policy.
//!
//! ```text
//! warren net ID                                   # the policy and the sandbox's address
//! warren net ID --none                            # loopback only
//! warren net ID --allow 10.254.1.0/24:443:tcp --service pypi --domain files.example.test
//! warren net ID --policy '{"mode":"allow","services":{"pypi":true}}'
//! ```
//! A new policy replaces the old one as a whole; new connections follow it at once.

use anyhow::{bail, Context as _};
use std::collections::BTreeMap;
use warren_types::{AllowRule, NetworkMode, NetworkPolicy, NetworkStatus, Ports, Protocol};

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox id
    pub id: String,
    /// Set policy none: loopback only
    #[arg(long, conflicts_with_all = ["allow", "service", "no_service", "domain", "policy"])]
    pub none: bool,
    /// Allow CIDR[:PORTS[:PROTO]], e.g. 10.254.1.0/24:443:tcp, 10.0.0.5:8000-8100, 10.1.0.0/16
    #[arg(long)]
    pub allow: Vec<String>,
    /// Switch on a named service of the node's network config (repeatable)
    #[arg(long)]
    pub service: Vec<String>,
    /// Name a service as off (explicit; off is the default)
    #[arg(long)]
    pub no_service: Vec<String>,
    /// Let the sandbox's resolver answer this name (repeatable; *.example.test for subdomains)
    #[arg(long)]
    pub domain: Vec<String>,
    /// The whole policy as JSON
    #[arg(long, conflicts_with_all = ["allow", "service", "no_service", "domain"])]
    pub policy: Option<String>,
    /// Print the answer as JSON
    #[arg(long)]
    pub json: bool,
}

/// Parses `CIDR[:PORTS[:PROTO]]`.
pub fn parse_allow(s: &str) -> anyhow::Result<AllowRule> {
    let mut parts = s.splitn(3, ':');
    let cidr = parts.next().unwrap_or_default().to_string();
    let ports = match parts.next() {
        Some(p) => Ports::parse(p).map_err(anyhow::Error::msg)?,
        None => Ports::Any,
    };
    let protocol = match parts.next() {
        None | Some("any") => Protocol::Any,
        Some("tcp") => Protocol::Tcp,
        Some("udp") => Protocol::Udp,
        Some(p) => bail!("--allow {s}: protocol must be tcp, udp or any, got {p:?}"),
    };
    Ok(AllowRule {
        cidr,
        ports,
        protocol,
    })
}

impl Args {
    /// The policy the flags describe, or `None` when they only ask to show it.
    fn policy(&self) -> anyhow::Result<Option<NetworkPolicy>> {
        if self.none {
            return Ok(Some(NetworkPolicy::none()));
        }
        if let Some(p) = &self.policy {
            let pol: NetworkPolicy = serde_json::from_str(p).context("--policy")?;
            return Ok(Some(pol));
        }
        if self.allow.is_empty()
            && self.service.is_empty()
            && self.no_service.is_empty()
            && self.domain.is_empty()
        {
            return Ok(None);
        }
        let mut services = BTreeMap::new();
        for s in &self.no_service {
            services.insert(s.clone(), false);
        }
        for s in &self.service {
            services.insert(s.clone(), true);
        }
        Ok(Some(NetworkPolicy {
            mode: NetworkMode::Allow,
            allow: self
                .allow
                .iter()
                .map(|a| parse_allow(a))
                .collect::<anyhow::Result<_>>()?,
            services,
            domains: self.domain.clone(),
        }))
    }
}

fn print(st: &NetworkStatus, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(st)?);
        return Ok(());
    }
    let p = &st.policy;
    if p.is_none() {
        println!("policy: none (loopback only)");
        return Ok(());
    }
    println!(
        "policy: allow; address {} gateway/resolver {}",
        st.address.as_deref().unwrap_or("-"),
        st.gateway.as_deref().unwrap_or("-")
    );
    for r in &p.allow {
        println!(
            "  allow   {} ports {} {}",
            r.cidr,
            r.ports,
            r.protocol.as_str()
        );
    }
    for (s, on) in &p.services {
        println!("  service {s} {}", if *on { "on" } else { "off" });
    }
    for d in &p.domains {
        println!("  domain  {d}");
    }
    Ok(())
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let st = match args.policy()? {
        Some(p) => client.set_network(&args.id, &p).await?,
        None => client.get_network(&args.id).await?,
    };
    print(&st, args.json)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_specs_parse() {
        let r = parse_allow("10.254.1.0/24:443:tcp").unwrap();
        assert_eq!(r.cidr, "10.254.1.0/24");
        assert_eq!(r.ports, Ports::Range(443, 443));
        assert_eq!(r.protocol, Protocol::Tcp);
        let r = parse_allow("10.0.0.5:8000-8100").unwrap();
        assert_eq!(r.ports, Ports::Range(8000, 8100));
        assert_eq!(r.protocol, Protocol::Any);
        assert_eq!(parse_allow("10.1.0.0/16").unwrap().ports, Ports::Any);
        assert!(parse_allow("10.1.0.0/16:80:icmp").is_err());
        assert!(parse_allow("10.1.0.0/16:http").is_err());
    }
}
