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
    /// Keys of the blobs whose key starts with `prefix` (a folder, ending in `/`), in no
    /// particular order. Not every store can list: HTTP cannot.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError>;
    /// The store's address, for messages.
    fn describe(&self) -> String;
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
