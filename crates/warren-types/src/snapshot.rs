//! Snapshots: a sandbox saved under a name of its own, from which new sandboxes start.
//!
//! A snapshot id names the node that holds it (`<node>-snap-<ulid>`), so a gateway routes a
//! snapshot call, or a create from a snapshot, without a global lookup — as for sandboxes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::id::{IdError, NodeId};
use crate::network::NetworkPolicy;
use crate::sandbox::{Limits, Substrate};
use crate::{validate, ApiError};

/// A snapshot id: `<node>-snap-<ulid in lowercase>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotId(String);

const MARK: &str = "-snap-";

impl SnapshotId {
    /// A fresh id held by `node`. ULIDs sort by creation time.
    pub fn generate(node: &NodeId) -> Self {
        SnapshotId(format!(
            "{node}{MARK}{}",
            ulid::Ulid::new().to_string().to_lowercase()
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The node that holds this snapshot.
    pub fn node(&self) -> NodeId {
        let (node, _) = self.0.split_once(MARK).expect("validated at construction");
        node.parse().expect("validated at construction")
    }
}

impl TryFrom<String> for SnapshotId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        let ok = s.split_once(MARK).is_some_and(|(node, ulid)| {
            node.parse::<NodeId>().is_ok()
                && ulid.len() == 26
                && ulid
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && ulid::Ulid::from_string(&ulid.to_uppercase()).is_ok()
        });
        if ok {
            Ok(SnapshotId(s))
        } else {
            Err(IdError::BadSnapshot(s))
        }
    }
}

impl From<SnapshotId> for String {
    fn from(n: SnapshotId) -> String {
        n.0
    }
}

impl FromStr for SnapshotId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        SnapshotId::try_from(s.to_string())
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `POST /v1/sandboxes/{id}/snapshot`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// Labels of the snapshot (not of the sandboxes made from it).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

impl CreateSnapshotRequest {
    pub fn validate(&self) -> Result<(), ApiError> {
        validate::labels(&self.labels)
    }
}

/// A snapshot as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    pub id: String,
    /// The sandbox it was taken of, and that sandbox's last trajectory entry then: a sandbox
    /// made from the snapshot starts its trajectory with a `forked_from` entry naming both.
    pub sandbox: String,
    pub sandbox_seq: u64,
    pub substrate: Substrate,
    pub image: Vec<String>,
    pub limits: Limits,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub network: NetworkPolicy,
    pub labels: BTreeMap<String, String>,
    /// True when it holds running processes and memory too (`microvm`, `vm`); false when it
    /// holds the files only (`container`: a sandbox made from it starts fresh processes).
    pub processes: bool,
    /// Bytes it keeps on the node's disk.
    pub size_bytes: u64,
    /// Unix time in milliseconds.
    pub created_at_ms: u64,
    /// The tenant that owns it (the sandbox's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_node_and_refuse_other_shapes() {
        let node: NodeId = "n1".parse().unwrap();
        let id = SnapshotId::generate(&node);
        assert!(id.as_str().starts_with("n1-snap-"));
        assert_eq!(id.node(), node);
        let back: SnapshotId = id.as_str().parse().unwrap();
        assert_eq!(back, id);
        for bad in [
            "",
            "n1-01jd0m7x4e8k0k9yq1w2e3r4t5",
            "n1-snap-",
            "N1-snap-01jd0m7x4e8k0k9yq1w2e3r4t5",
            "n1-snap-01JD0M7X4E8K0K9YQ1W2E3R4T5",
            "n1-snap-01jd0m7x4e8k0k9yq1w2e3r4t5/..",
            "n1-snap-snap-01jd0m7x4e8k0k9yq1w2e3r4",
        ] {
            assert!(bad.parse::<SnapshotId>().is_err(), "{bad}");
        }
    }
}
