//! The node's images as the API sees them: list, inspect, delete (with collection), gc.
//!
//! It owns nothing but a handle on the layer store the runtimes use (a node may serve
//! without one: then every image route answers `not_found`). Store work is file I/O and runs
//! on the blocking pool.

use bytes::Bytes;
use futures::{Stream, StreamExt};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use warren_image::import::registry::{import_registry, RegistryOptions};
use warren_image::import::ImportReport;
use warren_image::{ImageError, ImageStore};
use warren_types::auth::Caller;
use warren_types::{
    ApiError, ErrorCode, GcReport, ImageDeleted, ImageImported, ImageInfo, PullRequest,
};

use crate::error::NodeError;

/// The image routes' owner. Cheap to clone.
#[derive(Clone, Default)]
pub struct Images {
    store: Option<Arc<ImageStore>>,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field("store", &self.store.is_some())
            .finish()
    }
}

fn image_error(e: ImageError) -> NodeError {
    NodeError::Api(ApiError::new(e.code(), e.to_string()))
}

impl Images {
    /// Adds the remote layer cache's counters to a scrape's registry (nothing without a blob
    /// store).
    pub fn register_metrics(&self, reg: &mut prometheus_client::registry::Registry) {
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(s) = self.store.as_ref().and_then(|st| st.source_stats()) else {
            return;
        };
        for (name, help, v) in [
            (
                "warren_blob_cache_hits",
                "Layer chunk reads served from the node's cache",
                s.hits,
            ),
            (
                "warren_blob_cache_misses",
                "Layer chunk reads that waited for a fetch from the blob store",
                s.misses,
            ),
            (
                "warren_blob_fetches",
                "Range requests sent to the blob store",
                s.fetches,
            ),
            (
                "warren_blob_fetched_bytes",
                "Bytes of layer data fetched from the blob store",
                s.fetched_bytes,
            ),
            (
                "warren_blob_cache_evictions",
                "Layers evicted from the node's cache",
                s.evictions,
            ),
            (
                "warren_blob_corrupt_chunks",
                "Fetched chunks that failed verification (never served)",
                s.corrupt,
            ),
        ] {
            reg.register(name, help, ConstCounter::new(v));
        }
        reg.register(
            "warren_blob_cache_bytes",
            "Bytes of layer data held in the node's cache",
            ConstGauge::new(s.local_bytes as i64),
        );
    }

    /// Serves `store` (the store the runtimes use), or nothing.
    pub fn new(store: Option<Arc<ImageStore>>) -> Images {
        Images { store }
    }

    async fn on_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ImageStore) -> Result<T, ImageError> + Send + 'static,
    ) -> Result<T, NodeError> {
        let store = self.store.clone().ok_or_else(|| {
            NodeError::Api(ApiError::new(
                ErrorCode::NotFound,
                "this node has no image store",
            ))
        })?;
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| NodeError::Api(ApiError::internal(format!("image store task: {e}"))))?
            .map_err(image_error)
    }

    /// `GET /v1/images`: the node's own images and the caller's tenant's (admins see all).
    pub async fn list(&self, caller: &Caller) -> Result<Vec<ImageInfo>, NodeError> {
        let caller = caller.clone();
        self.on_store(move |s| {
            Ok(s.list_info()
                .into_iter()
                .filter(|i| visible(&caller, i.owner.as_deref()))
                .collect())
        })
        .await
    }

    /// `GET /v1/images/{ref}`: another tenant's image is not found, exactly like a missing one.
    pub async fn get(&self, caller: &Caller, r: &str) -> Result<ImageInfo, NodeError> {
        let (caller, r) = (caller.clone(), r.to_string());
        self.on_store(move |s| {
            let info = s.info(&r)?;
            if visible(&caller, info.owner.as_deref()) {
                Ok(info)
            } else {
                Err(ImageError::NotFound(r))
            }
        })
        .await
    }

    /// Refuses, as not found, an image stack naming another tenant's image, before a sandbox
    /// or a function call starts on it. The answer is the one a missing image gets, so a
    /// tenant learns nothing of another's images. Layer digests name content, not images,
    /// and are not checked.
    pub async fn check_usable(
        &self,
        caller: &Caller,
        refs: &[String],
        usage: Usage,
    ) -> Result<(), NodeError> {
        if caller.is_admin() || self.store.is_none() {
            return Ok(());
        }
        let (caller, refs) = (caller.clone(), refs.to_vec());
        let hidden = self
            .on_store(move |s| {
                Ok(refs.into_iter().find(|r| {
                    !r.starts_with("sha256:")
                        && s.manifest(r)
                            .is_ok_and(|m| !visible(&caller, m.owner.as_deref()))
                }))
            })
            .await?;
        let Some(r) = hidden else {
            return Ok(());
        };
        let missing = warren_runtime::RuntimeError::ImageNotFound(r);
        Err(match usage {
            Usage::Create => NodeError::CreateFailed { source: missing },
            Usage::Call => NodeError::Api(crate::functions::start_failed(&missing)),
        })
    }

    /// `DELETE /v1/images/{ref}`: untag, then collect what only that image referenced.
    pub async fn delete(&self, r: &str) -> Result<ImageDeleted, NodeError> {
        let r = r.to_string();
        self.on_store(move |s| s.remove_and_collect(&r)).await
    }

    /// `POST /v1/images/gc`.
    pub async fn gc(&self) -> Result<GcReport, NodeError> {
        self.on_store(|s| s.gc()).await
    }

    /// `POST /v1/images/import`: `body` is a `docker save` or OCI archive tar, kept in the
    /// store's scratch space while it is converted, then removed.
    pub async fn import<S, E>(
        &self,
        caller: &Caller,
        tag: Option<String>,
        force: bool,
        mut body: S,
    ) -> Result<ImageImported, NodeError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        if let Some(t) = &tag {
            warren_types::validate::image_ref(t)?;
        }
        let store = self.store.clone().ok_or_else(|| {
            NodeError::Api(ApiError::new(
                ErrorCode::NotFound,
                "this node has no image store",
            ))
        })?;
        let path = store.tmp_path("upload");
        let received = async {
            if let Some(dir) = path.parent() {
                tokio::fs::create_dir_all(dir).await?;
            }
            let mut f = tokio::fs::File::create(&path).await?;
            while let Some(chunk) = body.next().await {
                let chunk =
                    chunk.map_err(|e| std::io::Error::other(format!("upload interrupted: {e}")))?;
                f.write_all(&chunk).await?;
            }
            f.flush().await
        }
        .await;
        let result = match received {
            Ok(()) => {
                let (p, owner) = (path.clone(), owner_for(caller));
                self.on_store(move |s| s.import_upload(&p, tag.as_deref(), owner.as_deref(), force))
                    .await
            }
            Err(e) => Err(NodeError::Api(ApiError::invalid(format!(
                "receiving the archive: {e}"
            )))),
        };
        let _ = tokio::fs::remove_file(&path).await;
        result.map(imported)
    }

    /// `POST /v1/images/pull`: an image of an OCI registry.
    pub async fn pull(
        &self,
        caller: &Caller,
        req: PullRequest,
    ) -> Result<ImageImported, NodeError> {
        warren_types::validate::image_ref(&req.tag)?;
        let store = self.store.clone().ok_or_else(|| {
            NodeError::Api(ApiError::new(
                ErrorCode::NotFound,
                "this node has no image store",
            ))
        })?;
        let opts = RegistryOptions {
            insecure: req.insecure,
            credentials: req
                .username
                .clone()
                .map(|u| (u, req.password.clone().unwrap_or_default())),
            owner: owner_for(caller),
            replace: req.force,
        };
        import_registry(store, &req.reference, &req.tag, &opts)
            .await
            .map(imported)
            .map_err(image_error)
    }
}

/// What an image stack is checked for: the refusal is worded as that call words a missing
/// image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    Create,
    Call,
}

/// Whether `caller` may see an image owned by `owner` (`None`: the node's own, seen by all).
fn visible(caller: &Caller, owner: Option<&str>) -> bool {
    owner.is_none() || caller.sees(owner)
}

/// The owner of what `caller` imports: its tenant, or nobody (the node's own images) for
/// administrators, whose imports every tenant may use.
fn owner_for(caller: &Caller) -> Option<String> {
    if caller.is_admin() {
        None
    } else {
        caller.tenant.clone()
    }
}

fn imported(r: ImportReport) -> ImageImported {
    ImageImported {
        image: r.image,
        converted: r.converted,
        reused: r.reused,
        bytes_read: r.bytes_read,
        seconds: r.seconds,
    }
}
