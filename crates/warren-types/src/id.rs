//! Sandbox and node ids. A sandbox id encodes its owning node (`<node>-<ulid>`), so a gateway
//! can route any call without a global lookup.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why an id was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("node id must be 1-16 chars of [a-z0-9], got {0:?}")]
    BadNode(String),
    #[error("sandbox id must look like <node>-<ulid>, got {0:?}")]
    BadSandbox(String),
    #[error("snapshot id must look like <node>-snap-<ulid>, got {0:?}")]
    BadSnapshot(String),
}

/// A node's short name: 1-16 characters of `[a-z0-9]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeId(String);

impl NodeId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        let ok = !s.is_empty()
            && s.len() <= 16
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if ok {
            Ok(NodeId(s))
        } else {
            Err(IdError::BadNode(s))
        }
    }
}

impl From<NodeId> for String {
    fn from(n: NodeId) -> String {
        n.0
    }
}

impl FromStr for NodeId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        NodeId::try_from(s.to_string())
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A sandbox id: `<node>-<ulid in lowercase>`, e.g. `n1-01jd0m7x4e8k0k9yq1w2e3r4t5`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// A fresh id owned by `node`. ULIDs sort by creation time.
    pub fn generate(node: &NodeId) -> Self {
        SandboxId(format!(
            "{}-{}",
            node.0,
            ulid::Ulid::new().to_string().to_lowercase()
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The node that owns this sandbox.
    pub fn node(&self) -> NodeId {
        let (node, _) = self.0.split_once('-').expect("validated at construction");
        NodeId(node.to_string())
    }

    /// The order of listings across nodes: creation time (the ULID), then node. On one node
    /// this is id order.
    pub fn order_key(&self) -> (&str, &str) {
        let (node, ulid) = self.0.split_once('-').expect("validated at construction");
        (ulid, node)
    }

    /// A short form (node + last 8 chars) that is still unique enough for names of host
    /// objects with tight length limits (cgroup names are fine, netdev names are 15 chars).
    pub fn short(&self) -> &str {
        &self.0[self.0.len() - 10..]
    }
}

impl TryFrom<String> for SandboxId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        let Some((node, rest)) = s.split_once('-') else {
            return Err(IdError::BadSandbox(s));
        };
        if NodeId::try_from(node.to_string()).is_err() {
            return Err(IdError::BadSandbox(s));
        }
        let ok = rest.len() == 26
            && rest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            && ulid::Ulid::from_string(&rest.to_uppercase()).is_ok();
        if ok {
            Ok(SandboxId(s))
        } else {
            Err(IdError::BadSandbox(s))
        }
    }
}

impl From<SandboxId> for String {
    fn from(n: SandboxId) -> String {
        n.0
    }
}

impl FromStr for SandboxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SandboxId::try_from(s.to_string())
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_and_name_their_node() {
        let node: NodeId = "n1".parse().unwrap();
        let id = SandboxId::generate(&node);
        let back: SandboxId = id.as_str().parse().unwrap();
        assert_eq!(back, id);
        assert_eq!(back.node(), node);
        assert_eq!(id.short().len(), 10);
    }

    #[test]
    fn bad_ids_are_refused() {
        for bad in [
            "",
            "n1",
            "n1-",
            "N1-01jd0m7x4e8k0k9yq1w2e3r4t5",
            "n1-../../etc",
            "n1-zz",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad}");
        }
        assert!("".parse::<NodeId>().is_err());
        assert!("a-b".parse::<NodeId>().is_err());
        assert!("abcdefghijklmnopq".parse::<NodeId>().is_err());
    }
}
