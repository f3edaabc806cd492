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
use warren_image::{ImageError, ImageStore, ImportSource};
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

    /// `GET /v1/images`.
    pub async fn list(&self) -> Result<Vec<ImageInfo>, NodeError> {
        self.on_store(|s| Ok(s.list_info())).await
    }

    /// `GET /v1/images/{ref}`.
    pub async fn get(&self, r: &str) -> Result<ImageInfo, NodeError> {
        let r = r.to_string();
        self.on_store(move |s| s.info(&r)).await
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
        tag: Option<String>,
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
                let p = path.clone();
                self.on_store(move |s| s.import(&ImportSource::Archive(p), tag.as_deref()))
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
    pub async fn pull(&self, req: PullRequest) -> Result<ImageImported, NodeError> {
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
        };
        import_registry(store, &req.reference, &req.tag, &opts)
            .await
            .map(imported)
            .map_err(image_error)
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
