//! The layer store.
//!
//! A **layer** is an immutable EROFS image named by the sha256 of its bytes, with metadata
//! (size, source, creation time, media type, the diff id of the OCI layer it was converted
//! from). An **image** is a named, tagged, ordered stack of layers (lowest first), possibly
//! made of other images. Sandboxes compose stacks at start; no layer is ever copied or
//! unpacked per sandbox.
//!
//! On disk, under the store root:
//! ```text
//! blobs/sha256/<hex>          the EROFS image of a layer (never modified)
//! layers/<hex>.json           its metadata (synthesized from the blob when missing)
//! images/<name>/<tag>.json    an image: {"layers": ["sha256:<hex>", ...], "stack": [...], ...}
//! index/<hex>                 OCI layer digest or diff id → the layer it was converted to
//! build-cache/<hex>         a build step's key → the layer it made (see `cache`)
//! leases/<holder>.json        layers a live sandbox, fork or import holds (never collected)
//! mnt/<hex>                   the layer mounted read-only (shared by every sandbox)
//! mnt/<hex>.idmap-<base>      the same, idmapped for sandboxes whose root is host uid <base>
//! gc.lock                     shared by lease/add, exclusive while collecting
//! ```
//! The store may be shared by several daemons on one host; mounts are made under a file lock.
//! This crate never mounts anything per sandbox.
//!
//! Garbage collection (`gc`) unmounts and deletes every layer that no image and no lease
//! references. A sandbox's lease is written (under the shared lock, together with resolving
//! its refs) before its layers are mounted and removed when it is destroyed, so a collection
//! never removes a layer in use; releasing a lease collects the layers it held that nothing
//! else references (fork snapshots, layers of images removed while in use).

mod cache;
mod fetch;
mod files;
mod gc;
pub mod import;
mod layer;
mod lease;
mod store;

pub use fetch::{LayerPins, LayerSource, SourceStats};
pub use gc::is_temp_holder;
pub use import::{ImportReport, ImportSource};
pub use lease::Lease;
pub use store::{ImageManifest, ImageStore};
pub use warren_types::{GcReport, ImageDeleted, ImageInfo, LayerInfo};

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
    #[error("{what} does not match its digest: expected {expected}, found {found}")]
    DigestMismatch {
        what: String,
        expected: String,
        found: String,
    },
    #[error("building a layer from {dir}: {message}")]
    Build { dir: String, message: String },
    #[error("bad image archive {source_name}: {message}")]
    BadArchive {
        source_name: String,
        message: String,
    },
    #[error("unsupported media type {media_type:?} ({what})")]
    UnsupportedMedia { media_type: String, what: String },
    #[error("registry: {0}")]
    Registry(String),
    /// The registry never answered (no connection, TLS, a timeout).
    #[error("{0}")]
    RegistryUnreachable(String),
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
    /// The tag belongs to another owner.
    #[error("{0}")]
    Taken(String),
    /// The tag names an image already and the caller did not ask to replace it.
    #[error("image {0} exists: choose another tag, or replace it (`--force`; `force` in the API)")]
    Exists(String),
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

    pub(crate) fn archive(source_name: impl Into<String>, message: impl Into<String>) -> Self {
        ImageError::BadArchive {
            source_name: source_name.into(),
            message: message.into(),
        }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            ImageError::NotFound(_) => ErrorCode::NotFound,
            ImageError::BadRef(_)
            | ImageError::BadArchive { .. }
            | ImageError::UnsupportedMedia { .. }
            | ImageError::DigestMismatch { .. } => ErrorCode::InvalidRequest,
            ImageError::InUse(_) | ImageError::Taken(_) | ImageError::Exists(_) => {
                ErrorCode::Conflict
            }
            // The registry or blob store upstream failed (502), not this node.
            ImageError::Fetch { .. } | ImageError::Registry(_) => ErrorCode::StartFailed,
            ImageError::RegistryUnreachable(_) => ErrorCode::RegistryUnreachable,
            _ => ErrorCode::Internal,
        }
    }
}
