//! Errors of membership and placement.

use warren_types::NodeId;

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd did not answer or refused the call.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// etcd did not answer in time.
    #[error("etcd did not answer within {ms} ms ({what})")]
    Timeout { what: &'static str, ms: u64 },
    /// Another live node holds this node's id.
    #[error(
        "node id {id} is held by another live node (incarnation {incarnation}, address {address})"
    )]
    DuplicateNode {
        id: NodeId,
        incarnation: String,
        address: String,
    },
    /// A record in etcd could not be read.
    #[error("bad record under {key}: {message}")]
    BadRecord { key: String, message: String },
    /// No node of that id is known.
    #[error("node {0} is not a member of the cluster")]
    UnknownNode(String),
}

/// Another live node holds this node's id: the registration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node id {id} is held by another live node (incarnation {incarnation} at {address})")]
pub struct IdHeld {
    pub id: NodeId,
    pub incarnation: String,
    pub address: String,
}

/// Why a node did not join the cluster.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinError {
    /// The membership task ended.
    #[error("the membership task stopped")]
    Stopped,
    /// Another live node holds the id.
    #[error("{0}")]
    Refused(IdHeld),
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
