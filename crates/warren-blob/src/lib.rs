//! Blob stores and the node's layer cache.
//!
//! A **blob store** ([`BlobStore`]) holds layer blobs by key (`sha256/<hex>`) next to their
//! chunk tables (`sha256/<hex>.chunks`): a local directory, an HTTP(S) server that answers
//! range requests, or an S3-compatible bucket. A node reads remote layers through its
//! [`LayerCache`]: whole blobs (eager) or chunk by chunk on first read (lazy, served to the
//! kernel's EROFS file-backed mount through a FUSE file, see [`fuse`]). Every byte that leaves
//! the cache was checked against a sha256: a chunk against the layer's chunk table, a whole
//! blob against its digest.

mod backend;
mod cache;
mod chunks;
pub mod fuse;
mod http;
mod local;
mod s3;
pub mod serve;
mod source;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trajectory;
mod upload;

pub use backend::{open_store, BlobStore, BlobUpload};
pub use cache::{CacheConfig, CacheStats, LayerCache, Mode};
pub use chunks::{ChunkTable, DEFAULT_CHUNK_SIZE};
pub use http::HttpStore;
pub use local::LocalStore;
pub use s3::S3Store;
pub use source::{publish_layer, CacheSource};
pub use upload::{put_file, PART_BYTES};

use warren_types::ErrorCode;

/// Errors of blob stores and the layer cache.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("bad blob store address {0:?}: expected a directory, file://, http(s):// or s3://bucket/prefix")]
    BadUrl(String),
    #[error("blob {0} not found in the blob store")]
    NotFound(String),
    #[error("blob store {store} unreachable: {message}")]
    Unreachable { store: String, message: String },
    #[error("blob store {store}: {message}")]
    Backend { store: String, message: String },
    #[error("blob {key} is corrupt: {message}")]
    Corrupt { key: String, message: String },
    #[error("layer {0} is in use and cannot be evicted")]
    InUse(String),
    #[error("layer {0} is not in the cache")]
    NotCached(String),
    #[error("bad layer digest {0:?}")]
    BadDigest(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl BlobError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BlobError::Io {
            what: what.into(),
            source,
        }
    }

    /// The stable API error code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            BlobError::BadUrl(_) | BlobError::BadDigest(_) => ErrorCode::InvalidRequest,
            BlobError::NotFound(_) | BlobError::NotCached(_) => ErrorCode::NotFound,
            BlobError::InUse(_) => ErrorCode::Conflict,
            BlobError::Unreachable { .. } => ErrorCode::StartFailed,
            _ => ErrorCode::Internal,
        }
    }
}

/// `sha256:<hex>` → `<hex>`, checked.
pub fn hex_of(digest: &str) -> Result<&str, BlobError> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| BlobError::BadDigest(digest.to_string()))
}

/// The store key of a layer blob.
pub fn blob_key(hex: &str) -> String {
    format!("sha256/{hex}")
}

/// The store key of a layer's chunk table.
pub fn chunks_key(hex: &str) -> String {
    format!("sha256/{hex}.chunks")
}
