//! Errors of the network layer.

/// Everything that can go wrong while giving a sandbox its network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The node's network configuration file is unreadable or wrong.
    #[error("network config {path}: {source}")]
    Config {
        path: String,
        #[source]
        source: crate::config::ConfigError,
    },
    /// Addresses of the sandbox pool are already on the host (another daemon's links, a
    /// host network): sharing them would break both.
    #[error(
        "network config: the sandbox address pool {pool} overlaps addresses \
         on this host ({}); another warrend may use it: give each daemon its own pool \
         (`pool = \"10.x.0.0/16\"` in --network-config) or a distinct --node",
        taken.join(", ")
    )]
    PoolInUse { pool: String, taken: Vec<String> },
    /// A policy names something the node does not offer (unknown service).
    #[error("{0}")]
    Policy(String),
    /// The address pool has no free link left.
    #[error("the sandbox address pool {pool} is exhausted ({links} links)")]
    PoolExhausted { pool: String, links: u32 },
    /// A netlink call (links, addresses, routes) failed.
    #[error("netlink: {what}: {message}")]
    Netlink { what: String, message: String },
    /// The kernel cannot list or delete tracked connections (no connection-tracking netlink:
    /// `CONFIG_NF_CT_NETLINK`, module `nf_conntrack_netlink`).
    #[error(
        "connection tracking over netlink is not available in this kernel ({0}): it needs \
         CONFIG_NF_CT_NETLINK (module nf_conntrack_netlink)"
    )]
    ConntrackUnsupported(String),
    /// An nftables batch was refused.
    #[error("nftables: {0}")]
    Nft(#[from] warren_sys::nft::NftError),
    /// nftables cannot be used on this host at all.
    #[error("nftables: {0} (install nftables / libnftables1)")]
    NftMissing(#[source] warren_sys::nft::NftError),
    /// The sandbox's resolver could not start.
    #[error("resolver on {addr}: {source}")]
    Resolver {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    /// Any other host failure.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl NetError {
    pub(crate) fn netlink(what: impl Into<String>, e: impl std::fmt::Display) -> Self {
        NetError::Netlink {
            what: what.into(),
            message: e.to_string(),
        }
    }
}
