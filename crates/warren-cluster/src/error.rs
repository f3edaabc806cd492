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

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
