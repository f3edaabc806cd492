//! Images and layers as the API shows them (`GET /v1/images`, `GET /v1/images/{ref}`, GC).

use serde::{Deserialize, Serialize};

/// The media type of every layer of the store: a read-only EROFS filesystem image whose
/// whiteouts are overlayfs character devices 0/0 and whose opaque directories carry
/// `user.overlay.opaque=y`.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.warren.layer.v1.erofs";

/// One immutable layer of the store, named by the sha256 of its EROFS image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    /// `sha256:<hex>` of the EROFS image.
    pub digest: String,
    pub size_bytes: u64,
    /// Milliseconds since the Unix epoch; 0 when unknown (layers stored before metadata).
    #[serde(default)]
    pub created_ms: u64,
    /// Where it came from: a directory, `oci:<digest>` of an imported layer, a fork snapshot.
    #[serde(default)]
    pub source: String,
    #[serde(default = "default_media_type")]
    pub media_type: String,
    /// For imported layers: the digest of the uncompressed tar (the OCI diff id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff_id: Option<String>,
}

fn default_media_type() -> String {
    LAYER_MEDIA_TYPE.to_string()
}

/// A named, versioned image: an ordered stack of layers, lowest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// `name:tag`.
    pub reference: String,
    pub name: String,
    pub tag: String,
    /// The refs the image was made of, as given (other images or layer digests), lowest first.
    #[serde(default)]
    pub stack: Vec<String>,
    /// Its layers, lowest first.
    pub layers: Vec<LayerInfo>,
    pub size_bytes: u64,
    pub created_ms: u64,
    pub source: String,
    /// The tenant the image belongs to (only it and admins see it); absent for the node's
    /// own images, which every tenant may use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Layers unmounted and deleted.
    pub removed: Vec<String>,
    pub freed_bytes: u64,
    /// Layers no image references that live sandboxes (or imports in progress) still use:
    /// kept until they are released.
    pub in_use: Vec<String>,
}

/// `DELETE /v1/images/{ref}`: the tag is gone; `gc` is the collection that followed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDeleted {
    pub reference: String,
    pub gc: GcReport,
}

/// `POST /v1/images/import` and `POST /v1/images/pull`: the image made and what it took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageImported {
    pub image: ImageInfo,
    /// Layers converted by this import.
    pub converted: usize,
    /// Layers found already converted.
    pub reused: usize,
    /// Bytes of layer data read (as stored: compressed if compressed).
    pub bytes_read: u64,
    pub seconds: f64,
}

/// `POST /v1/images/pull`: an image of an OCI registry, converted and tagged on the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullRequest {
    /// `host[:port]/repo[:tag|@digest]`.
    pub reference: String,
    /// `name[:tag]` of the new image.
    pub tag: String,
    /// Plain HTTP instead of HTTPS.
    #[serde(default)]
    pub insecure: bool,
    /// Registry credentials; anonymous when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl std::fmt::Display for PullRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} as {}", self.reference, self.tag)
    }
}
