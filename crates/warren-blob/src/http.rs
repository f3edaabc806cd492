//! A read-only blob store behind HTTP(S), read with range requests.

use bytes::Bytes;
use reqwest::StatusCode;
use std::ops::Range;
use std::time::Duration;

use crate::{BlobError, BlobStore, BlobUpload};

/// Blobs at `BASE/<key>`; ranges with `Range: bytes=a-b` (a `206` answer is required).
#[derive(Debug, Clone)]
pub struct HttpStore {
    base: String,
    client: reqwest::Client,
}

impl HttpStore {
    pub fn new(base: &str) -> Result<Self, BlobError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .pool_max_idle_per_host(64)
            .build()
            .map_err(|e| BlobError::Backend {
                store: base.to_string(),
                message: e.to_string(),
            })?;
        Ok(HttpStore {
            base: base.trim_end_matches('/').to_string(),
            client,
        })
    }

    fn url(&self, key: &str) -> String {
        format!("{}/{key}", self.base)
    }

    fn err(&self, key: &str, e: reqwest::Error) -> BlobError {
        if e.is_connect() || e.is_timeout() {
            BlobError::Unreachable {
                store: self.base.clone(),
                message: format!("{key}: {e}"),
            }
        } else {
            BlobError::Backend {
                store: self.base.clone(),
                message: format!("{key}: {e}"),
            }
        }
    }

    fn status(&self, key: &str, s: StatusCode) -> BlobError {
        if s == StatusCode::NOT_FOUND {
            BlobError::NotFound(key.to_string())
        } else {
            BlobError::Backend {
                store: self.base.clone(),
                message: format!("{key}: HTTP {s}"),
            }
        }
    }
}

#[async_trait::async_trait]
impl BlobStore for HttpStore {
    async fn head(&self, key: &str) -> Result<u64, BlobError> {
        let r = self
            .client
            .head(self.url(key))
            .send()
            .await
            .map_err(|e| self.err(key, e))?;
        if !r.status().is_success() {
            return Err(self.status(key, r.status()));
        }
        r.headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| BlobError::Backend {
                store: self.base.clone(),
                message: format!("{key}: no Content-Length"),
            })
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, BlobError> {
        if range.end <= range.start {
            return Ok(Bytes::new());
        }
        let r = self
            .client
            .get(self.url(key))
            .header(
                reqwest::header::RANGE,
                format!("bytes={}-{}", range.start, range.end - 1),
            )
            .send()
            .await
            .map_err(|e| self.err(key, e))?;
        if r.status() != StatusCode::PARTIAL_CONTENT {
            return Err(if r.status().is_success() {
                BlobError::Backend {
                    store: self.base.clone(),
                    message: format!("{key}: the server ignored the Range header"),
                }
            } else {
                self.status(key, r.status())
            });
        }
        r.bytes().await.map_err(|e| self.err(key, e))
    }

    async fn get(&self, key: &str) -> Result<Bytes, BlobError> {
        let r = self
            .client
            .get(self.url(key))
            .send()
            .await
            .map_err(|e| self.err(key, e))?;
        if !r.status().is_success() {
            return Err(self.status(key, r.status()));
        }
        r.bytes().await.map_err(|e| self.err(key, e))
    }

    async fn put(&self, key: &str, _data: Bytes) -> Result<(), BlobError> {
        Err(BlobError::Backend {
            store: self.base.clone(),
            message: format!("{key}: HTTP blob stores are read-only"),
        })
    }

    async fn put_parts(&self, key: &str) -> Result<Box<dyn BlobUpload>, BlobError> {
        Err(BlobError::Backend {
            store: self.base.clone(),
            message: format!("{key}: HTTP blob stores are read-only"),
        })
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        Err(BlobError::Backend {
            store: self.base.clone(),
            message: format!("{prefix}: HTTP blob stores cannot be listed"),
        })
    }

    fn describe(&self) -> String {
        self.base.clone()
    }
}
