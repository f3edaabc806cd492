//! Image routes: list, inspect, delete, collect.

use hyper::Method;
use serde::Deserialize;
use warren_types::{GcReport, ImageDeleted, ImageImported, ImageInfo, PullRequest};

use crate::client::{enc, seg, Client};
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

    /// `POST /v1/images/import?tag=`: sends a `docker save` or OCI archive (streamed from
    /// `archive`) for the node to convert and tag.
    pub async fn import_image<R>(
        &self,
        archive: R,
        tag: Option<&str>,
    ) -> Result<ImageImported, ClientError>
    where
        R: tokio::io::AsyncRead + Send + 'static,
    {
        use futures::TryStreamExt;
        use http_body_util::{BodyExt, StreamBody};
        let path = match tag {
            Some(t) => format!("/v1/images/import?tag={}", enc(t)),
            None => "/v1/images/import".to_string(),
        };
        let chunks = tokio_util::io::ReaderStream::with_capacity(archive, 256 << 10)
            .map_ok(hyper::body::Frame::data);
        let body: crate::client::Body = StreamBody::new(chunks).boxed_unsync();
        self.send(
            Method::POST,
            &path,
            crate::client::Payload::stream(body),
            Some("application/x-tar"),
        )
        .await?
        .json("the import report")
        .await
    }

    /// `POST /v1/images/pull`: the node pulls an image of an OCI registry and tags it.
    pub async fn pull_image(&self, req: &PullRequest) -> Result<ImageImported, ClientError> {
        self.call_json(
            Method::POST,
            "/v1/images/pull",
            Some(req),
            "the import report",
        )
        .await
    }
}
