//! Image routes: list, inspect, delete, collect.

use hyper::Method;
use serde::Deserialize;
use warren_types::{GcReport, ImageDeleted, ImageInfo};

use crate::client::{seg, Client};
use crate::error::ClientError;

#[derive(Deserialize)]
struct ImageList {
    images: Vec<ImageInfo>,
}

impl Client {
    /// `GET /v1/images`: every image of the node's layer store.
    pub async fn images(&self) -> Result<Vec<ImageInfo>, ClientError> {
        let l: ImageList = self
            .call_json(Method::GET, "/v1/images", None::<&()>, "the image list")
            .await?;
        Ok(l.images)
    }

    /// `GET /v1/images/{ref}`: one image (`name[:tag]`) with its layers.
    pub async fn image(&self, reference: &str) -> Result<ImageInfo, ClientError> {
        let path = format!("/v1/images/{}", seg(reference));
        self.call_json(Method::GET, &path, None::<&()>, "the image")
            .await
    }

    /// `DELETE /v1/images/{ref}`: removes the tag and collects the layers nothing else uses.
    pub async fn delete_image(&self, reference: &str) -> Result<ImageDeleted, ClientError> {
        let path = format!("/v1/images/{}", seg(reference));
        self.call_json(Method::DELETE, &path, None::<&()>, "the deletion report")
            .await
    }

    /// `POST /v1/images/gc`: collects every layer no image and no live sandbox references.
    pub async fn gc_images(&self) -> Result<GcReport, ClientError> {
        self.call_json(
            Method::POST,
            "/v1/images/gc",
            None::<&()>,
            "the collection report",
        )
        .await
    }
}
