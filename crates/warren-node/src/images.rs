//! The node's images as the API sees them: list, inspect, delete (with collection), gc.
//!
//! It owns nothing but a handle on the layer store the runtimes use (a node may serve
//! without one: then every image route answers `not_found`). Store work is file I/O and runs
//! on the blocking pool.

use std::sync::Arc;
use warren_image::{ImageError, ImageStore};
use warren_types::{ApiError, ErrorCode, GcReport, ImageDeleted, ImageInfo};

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
}
