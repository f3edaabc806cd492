//! The node's layer store as the API sees it: list, inspect, delete (with collection), gc.
//! Store work is file I/O and runs on the blocking pool.

use std::sync::Arc;
use warren_image::{ImageError, ImageStore};
use warren_types::{ApiError, ErrorCode, GcReport, ImageDeleted, ImageInfo};

use super::Manager;
use crate::error::NodeError;

fn image_error(e: ImageError) -> NodeError {
    NodeError::Api(ApiError::new(e.code(), e.to_string()))
}

impl Manager {
    /// Serves `store` through the image routes (the store the container runtime uses).
    pub fn with_image_store(self, store: Arc<ImageStore>) -> Self {
        let _ = self.inner.images.set(store);
        self
    }

    fn image_store(&self) -> Result<Arc<ImageStore>, NodeError> {
        self.inner.images.get().cloned().ok_or_else(|| {
            NodeError::Api(ApiError::new(
                ErrorCode::NotFound,
                "this node has no image store",
            ))
        })
    }

    async fn on_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&ImageStore) -> Result<T, ImageError> + Send + 'static,
    ) -> Result<T, NodeError> {
        let store = self.image_store()?;
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| NodeError::Api(ApiError::internal(format!("image store task: {e}"))))?
            .map_err(image_error)
    }

    /// `GET /v1/images`.
    pub async fn list_images(&self) -> Result<Vec<ImageInfo>, NodeError> {
        self.on_store(|s| Ok(s.list_info())).await
    }

    /// `GET /v1/images/{ref}`.
    pub async fn image(&self, r: &str) -> Result<ImageInfo, NodeError> {
        let r = r.to_string();
        self.on_store(move |s| s.info(&r)).await
    }

    /// `DELETE /v1/images/{ref}`: untag, then collect what only that image referenced.
    pub async fn delete_image(&self, r: &str) -> Result<ImageDeleted, NodeError> {
        let r = r.to_string();
        self.on_store(move |s| s.remove_and_collect(&r)).await
    }

    /// `POST /v1/images/gc`.
    pub async fn gc_images(&self) -> Result<GcReport, NodeError> {
        self.on_store(|s| s.gc()).await
    }
}
