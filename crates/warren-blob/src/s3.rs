//! An S3-compatible blob store (through the `object_store` crate).

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjPath;
use object_store::{MultipartUpload, ObjectStore};
use std::ops::Range;
use std::sync::Arc;

use crate::{BlobError, BlobStore, BlobUpload};

/// Blobs at `s3://BUCKET/PREFIX/<key>`. Endpoint, region and credentials come from the usual
/// `AWS_*` variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`); a plain-`http://` endpoint is allowed.
#[derive(Debug, Clone)]
pub struct S3Store {
    url: String,
    prefix: String,
    inner: Arc<dyn ObjectStore>,
}

impl S3Store {
    /// `rest` is `BUCKET[/PREFIX]` (the part of the address after `s3://`).
    pub fn from_env(rest: &str) -> Result<Self, BlobError> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(BlobError::BadUrl(format!("s3://{rest}")));
        }
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .ok();
        if let Some(e) = endpoint {
            b = b
                .with_allow_http(e.starts_with("http://"))
                .with_endpoint(e)
                .with_virtual_hosted_style_request(false);
        }
        if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
            b = b.with_region("us-east-1");
        }
        let inner = b.build().map_err(|e| BlobError::Backend {
            store: format!("s3://{rest}"),
            message: e.to_string(),
        })?;
        Ok(S3Store {
            url: format!("s3://{rest}"),
            prefix: prefix.trim_matches('/').to_string(),
            inner: Arc::new(inner),
        })
    }

    fn path(&self, key: &str) -> ObjPath {
        if self.prefix.is_empty() {
            ObjPath::from(key)
        } else {
            ObjPath::from(format!("{}/{key}", self.prefix))
        }
    }

    fn err(&self, key: &str, e: object_store::Error) -> BlobError {
        match e {
            object_store::Error::NotFound { .. } => BlobError::NotFound(key.to_string()),
            e => {
                let message = format!("{key}: {e}");
                let low = message.to_lowercase();
                if low.contains("connect") || low.contains("timed out") || low.contains("dns") {
                    BlobError::Unreachable {
                        store: self.url.clone(),
                        message,
                    }
                } else {
                    BlobError::Backend {
                        store: self.url.clone(),
                        message,
                    }
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl BlobStore for S3Store {
    async fn head(&self, key: &str) -> Result<u64, BlobError> {
        let m = self
            .inner
            .head(&self.path(key))
            .await
            .map_err(|e| self.err(key, e))?;
        Ok(m.size)
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.end <= range.start {
            return Ok(Bytes::new());
        }
        self.inner
            .get_range(&self.path(key), range)
            .await
            .map_err(|e| self.err(key, e))
    }

    async fn get(&self, key: &str) -> Result<Bytes, BlobError> {
        let r = self
            .inner
            .get(&self.path(key))
            .await
            .map_err(|e| self.err(key, e))?;
        r.bytes().await.map_err(|e| self.err(key, e))
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        self.inner
            .put(&self.path(key), data.into())
            .await
            .map(|_| ())
            .map_err(|e| self.err(key, e))
    }

    async fn put_parts(&self, key: &str) -> Result<Box<dyn BlobUpload>, BlobError> {
        let inner = self
            .inner
            .put_multipart(&self.path(key))
            .await
            .map_err(|e| self.err(key, e))?;
        Ok(Box::new(S3Upload {
            store: self.clone(),
            key: key.to_string(),
            inner,
        }))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        use futures::TryStreamExt;
        let under = self.path(prefix.trim_end_matches('/'));
        let metas: Vec<object_store::ObjectMeta> = self
            .inner
            .list(Some(&under))
            .try_collect()
            .await
            .map_err(|e| self.err(prefix, e))?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        Ok(metas
            .into_iter()
            .filter_map(|m| m.location.as_ref().strip_prefix(&strip).map(String::from))
            .collect())
    }

    fn describe(&self) -> String {
        self.url.clone()
    }
}

/// A multipart upload to an [`S3Store`], a part at a time.
#[derive(Debug)]
struct S3Upload {
    store: S3Store,
    key: String,
    inner: Box<dyn MultipartUpload>,
}

#[async_trait::async_trait]
impl BlobUpload for S3Upload {
    async fn put_part(&mut self, part: Bytes) -> Result<(), BlobError> {
        self.inner
            .put_part(part.into())
            .await
            .map_err(|e| self.store.err(&self.key, e))
    }

    async fn complete(mut self: Box<Self>) -> Result<(), BlobError> {
        self.inner
            .complete()
            .await
            .map(|_| ())
            .map_err(|e| self.store.err(&self.key, e))
    }

    async fn abort(mut self: Box<Self>) -> Result<(), BlobError> {
        self.inner
            .abort()
            .await
            .map_err(|e| self.store.err(&self.key, e))
    }
}
