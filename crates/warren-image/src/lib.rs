//! The layer store.
//!
//! A **layer** is an immutable EROFS image named by the sha256 of its bytes. An **image** is
//! a named, tagged, ordered stack of layers (lowest first). Sandboxes compose stacks at start;
//! no layer is ever copied or unpacked per sandbox.
//!
//! On disk, under the store root:
//! ```text
//! blobs/sha256/<hex>          the EROFS image of a layer (never modified)
//! images/<name>/<tag>.json    an image: {"layers": ["sha256:<hex>", ...], ...}
//! mnt/<hex>                   the layer mounted read-only (shared by every sandbox)
//! mnt/<hex>.idmap-<base>      the same, idmapped for sandboxes whose root is host uid <base>
//! ```
//! The store may be shared by several daemons on one host; mounts are made under a file lock.
//! This crate never mounts anything per sandbox.

mod fetch;
mod store;

pub use fetch::{LayerPins, LayerSource};
pub use store::{ImageManifest, ImageStore, LayerInfo};

use warren_types::ErrorCode;

/// Errors of the layer store.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("image {0:?} not found")]
    NotFound(String),
    #[error("bad image reference: {0}")]
    BadRef(String),
    #[error("layer {digest} is corrupt: expected sha256 {digest}, found {found}")]
    Corrupt { digest: String, found: String },
    #[error("building a layer from {dir}: {message}")]
    Build { dir: String, message: String },
    #[error("mounting layer {digest}: {source}")]
    Mount {
        digest: String,
        #[source]
        source: warren_sys::SysError,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("image {0:?} is in use")]
    InUse(String),
    /// A layer missing from the store could not be fetched (blob store unreachable, corrupt).
    #[error("layer {digest}: {message}")]
    Fetch { digest: String, message: String },
}

impl ImageError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ImageError::Io {
            what: what.into(),
            source,
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ImageError::NotFound(_) => ErrorCode::NotFound,
            ImageError::BadRef(_) => ErrorCode::InvalidRequest,
            ImageError::InUse(_) => ErrorCode::Conflict,
            ImageError::Fetch { .. } => ErrorCode::StartFailed,
            _ => ErrorCode::Internal,
        }
    }
}
