//! The layer store's errors, each with its stable API code.

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
