//! The blob store trait and opening a store from an address.

use bytes::Bytes;
use std::ops::Range;
use std::sync::Arc;

use crate::{BlobError, HttpStore, LocalStore, S3Store};

/// A store of immutable blobs addressed by key (`sha256/<hex>`, `sha256/<hex>.chunks`).
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + std::fmt::Debug {
    /// Size of a blob in bytes (`NotFound` if absent).
    async fn head(&self, key: &str) -> Result<u64, BlobError>;
    /// Bytes `range` of a blob. A short answer is returned as is (the caller verifies).
    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError>;
    /// A whole (small) blob.
    async fn get(&self, key: &str) -> Result<Bytes, BlobError>;
    /// Stores a blob (not every store is writable: HTTP is read-only).
    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError>;
    /// Starts storing a blob by parts, for one too large to hold whole (see
    /// [`put_file`](crate::put_file)): nothing is visible under `key` until the upload is
    /// completed, and an aborted or dropped upload leaves nothing behind where the store
    /// allows (an S3 upload dropped without `abort` keeps its parts until the bucket's
    /// lifecycle removes them).
    async fn put_parts(&self, key: &str) -> Result<Box<dyn BlobUpload>, BlobError>;
    /// Keys of the blobs whose key starts with `prefix` (a folder, ending in `/`), in no
    /// particular order. Not every store can list: HTTP cannot.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError>;
    /// The store's address, for messages.
    fn describe(&self) -> String;
}

/// A blob being stored by parts ([`BlobStore::put_parts`]).
#[async_trait::async_trait]
pub trait BlobUpload: Send + std::fmt::Debug {
    /// Appends `part`. Every part but the last must hold at least 5 MiB (S3's least part;
    /// [`put_file`](crate::put_file) sends [`PART_BYTES`](crate::PART_BYTES)).
    async fn put_part(&mut self, part: Bytes) -> Result<(), BlobError>;
    /// Makes the parts, in order, the blob under its key.
    async fn complete(self: Box<Self>) -> Result<(), BlobError>;
    /// Gives up: the parts sent are discarded and the key is left as it was.
    async fn abort(self: Box<Self>) -> Result<(), BlobError>;
}

/// Opens a store from an address: a directory path or `file://DIR`, `http(s)://HOST/PREFIX`,
/// or `s3://BUCKET/PREFIX` (endpoint, region and credentials from the `AWS_*` environment).
pub fn open_store(url: &str) -> Result<Arc<dyn BlobStore>, BlobError> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(Arc::new(HttpStore::new(url)?))
    } else if let Some(rest) = url.strip_prefix("s3://") {
        Ok(Arc::new(S3Store::from_env(rest)?))
    } else if let Some(p) = url.strip_prefix("file://") {
        Ok(Arc::new(LocalStore::new(p)))
    } else if url.starts_with('/') {
        Ok(Arc::new(LocalStore::new(url)))
    } else {
        Err(BlobError::BadUrl(url.to_string()))
    }
}
