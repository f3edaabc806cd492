//! Test doubles for the tests of this crate and of the crates that ship to a blob store
//! (built for unit tests, or with the `testing` feature; never in a binary).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::{BlobError, BlobStore, BlobUpload, LocalStore};

/// A local store that remembers the most bytes it was handed at once, by `put` or by one
/// part of an upload: what a test of a bounded upload checks.
#[derive(Debug)]
pub struct LargestHanded {
    inner: LocalStore,
    most: Arc<AtomicUsize>,
}

impl LargestHanded {
    pub fn new(inner: LocalStore) -> Self {
        LargestHanded {
            inner,
            most: Arc::default(),
        }
    }

    /// The most bytes handed at once so far.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    fn handed(&self, n: usize) {
        self.most.fetch_max(n, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct LargestUpload {
    inner: Box<dyn BlobUpload>,
    most: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl BlobStore for LargestHanded {
    async fn head(&self, key: &str) -> Result<u64, BlobError> {
        self.inner.head(key).await
    }
    async fn get_range(&self, key: &str, r: std::ops::Range<u64>) -> Result<Bytes, BlobError> {
        self.inner.get_range(key, r).await
    }
    async fn get(&self, key: &str) -> Result<Bytes, BlobError> {
        self.inner.get(key).await
    }
    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        self.handed(data.len());
        self.inner.put(key, data).await
    }
    async fn put_parts(&self, key: &str) -> Result<Box<dyn BlobUpload>, BlobError> {
        Ok(Box::new(LargestUpload {
            inner: self.inner.put_parts(key).await?,
            most: self.most.clone(),
        }))
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[async_trait::async_trait]
impl BlobUpload for LargestUpload {
    async fn put_part(&mut self, part: Bytes) -> Result<(), BlobError> {
        self.most.fetch_max(part.len(), Ordering::SeqCst);
        self.inner.put_part(part).await
    }
    async fn complete(self: Box<Self>) -> Result<(), BlobError> {
        self.inner.complete().await
    }
    async fn abort(self: Box<Self>) -> Result<(), BlobError> {
        self.inner.abort().await
    }
}
