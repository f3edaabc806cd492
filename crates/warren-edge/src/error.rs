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
        source: crate::auth_file::AuthFileError,
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
