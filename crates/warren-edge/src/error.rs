//! Errors of the edge: reading the auth file and the TLS files, binding listeners.

use std::path::PathBuf;

/// Everything setting up the edge can fail with. Request-time failures are API errors
/// (`unauthorized`), never this type.
#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The auth file is not valid TOML of the expected shape.
    #[error("auth file {path}: {source}")]
    AuthFile {
        path: PathBuf,
        #[source]
        source: AuthFileError,
    },
    /// A certificate, key or CA file is unusable.
    #[error("TLS {what} {path}: {reason}")]
    Tls {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The listen configuration is refused (e.g. plain TCP on a non-loopback address).
    #[error("{0}")]
    Config(String),
    /// Binding a listener failed.
    #[error("cannot bind {addr}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong in an auth file, and where.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    /// Not TOML of the auth file's shape.
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// A tenant's name is not one the API accepts.
    #[error("{message}")]
    TenantName { name: String, message: String },
    /// Two tenants have one name.
    #[error("tenant {name:?} is listed twice")]
    Twice { name: String },
    /// A token hash is not 64 hex digits.
    #[error(
        "tenant {tenant:?}: token_sha256 entries must be 64 hex digits (sha256 of the token), got {hash:?}"
    )]
    Hash { tenant: String, hash: String },
    /// One token hash stands in the file more than once (one token, two callers).
    #[error("tenant {tenant:?}: token hash {hash} is listed more than once")]
    SharedHash { tenant: String, hash: String },
    /// A tenant's quota cannot work; `what` says which and why.
    #[error("tenant {tenant:?}: {what}")]
    Quota { tenant: String, what: &'static str },
}
