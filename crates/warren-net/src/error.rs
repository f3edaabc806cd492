//! Errors of the network layer.

/// Everything that can go wrong while giving a sandbox its network.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The node's network configuration file is unreadable or wrong.
    #[error("network config {path}: {source}")]
    Config {
        path: String,
        #[source]
        source: ConfigError,
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

/// Why the node's network refuses policies now.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unready {
    /// [`Network::start`](crate::Network::start) has not run yet.
    #[error("the network is not started")]
    NotStarted,
    /// [`Network::shutdown`](crate::Network::shutdown) took the links and table away.
    #[error("the network is shut down")]
    ShutDown,
    /// The start failed.
    #[error("{0}")]
    StartFailed(std::sync::Arc<NetError>),
}

/// What is wrong with a network configuration (the file, or one of its entries).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{0}")]
    Read(#[source] std::io::Error),
    /// The file is not TOML of this shape.
    #[error("{0}")]
    Toml(#[source] toml::de::Error),
    /// The file is not JSON of this shape.
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    /// The address pool is not an IPv4 network.
    #[error("pool: {0}")]
    Pool(#[source] warren_types::network::AddressError),
    /// The address pool cannot hold enough links.
    #[error("pool {pool} is too small (at most /28)")]
    PoolTooSmall { pool: String },
    /// A service's name is not one a policy can use.
    #[error("{message}")]
    ServiceName { name: String, message: String },
    /// A service's network is not an IPv4 network.
    #[error("service {service}: {source}")]
    ServiceNetwork {
        service: String,
        #[source]
        source: warren_types::network::AddressError,
    },
    /// A service's hostname is not a name or a `*.` pattern.
    #[error("service {service}: {message}")]
    ServiceHostname {
        service: String,
        hostname: String,
        message: String,
    },
    /// A static host entry's name is not a name or a `*.` pattern.
    #[error("hosts: {message}")]
    HostName { name: String, message: String },
}
