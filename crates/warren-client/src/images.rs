//! Image routes: list, inspect, delete, collect.

use hyper::Method;
use serde::Deserialize;
use warren_types::{
    BuildEvent, BuildOptions, GcReport, ImageDeleted, ImageImported, ImageInfo, PullRequest,
};

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
    /// `archive`) for the node to convert and tag. An image of that tag is replaced only
    /// with `force` (else 409 `conflict`).
    pub async fn import_image<R>(
        &self,
        archive: R,
        tag: Option<&str>,
        force: bool,
    ) -> Result<ImageImported, ClientError>
    where
        R: tokio::io::AsyncRead + Send + 'static,
    {
        use futures::TryStreamExt;
        use http_body_util::{BodyExt, StreamBody};
        let mut q = Vec::new();
        if let Some(t) = tag {
            q.push(format!("tag={}", enc(t)));
        }
        if force {
            q.push("force=true".to_string());
        }
        let path = if q.is_empty() {
            "/v1/images/import".to_string()
        } else {
            format!("/v1/images/import?{}", q.join("&"))
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

    /// `POST /v1/images/build`: sends the build context (a tar, streamed from `context`)
    /// and returns the build's log as it happens, ending with a `result` or `error` event.
    pub async fn build_image<R>(
        &self,
        context: R,
        opts: &BuildOptions,
    ) -> Result<BuildStream, ClientError>
    where
        R: tokio::io::AsyncRead + Send + 'static,
    {
        use futures::TryStreamExt;
        use http_body_util::{BodyExt, StreamBody};
        let mut q = vec![format!("tag={}", enc(&opts.tag))];
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                q.push(format!("{k}={}", enc(&v)));
            }
        };
        add("dockerfile", opts.dockerfile.clone());
        add("target", opts.target.clone());
        add("network", opts.network.clone());
        add("memory_mb", opts.memory_mb.map(|v| v.to_string()));
        add("cpus", opts.cpus.map(|v| v.to_string()));
        add("disk_mb", opts.disk_mb.map(|v| v.to_string()));
        add(
            "step_timeout_secs",
            opts.step_timeout_secs.map(|v| v.to_string()),
        );
        if opts.no_cache {
            add("no_cache", Some("true".into()));
        }
        if opts.insecure {
            add("insecure", Some("true".into()));
        }
        for (k, v) in &opts.build_args {
            add("build_arg", Some(format!("{k}={v}")));
        }
        let path = format!("/v1/images/build?{}", q.join("&"));
        let chunks = tokio_util::io::ReaderStream::with_capacity(context, 256 << 10)
            .map_ok(hyper::body::Frame::data);
        let body: crate::client::Body = StreamBody::new(chunks).boxed_unsync();
        let reply = self
            .send(
                Method::POST,
                &path,
                crate::client::Payload::stream(body),
                Some("application/x-tar"),
            )
            .await?;
        Ok(BuildStream {
            inner: Box::pin(crate::stream::ndjson(reply.into_stream())),
        })
    }
}

/// The log of a build: [`BuildEvent`]s in order, the last one `Result` or `Error`.
pub struct BuildStream {
    inner: futures::stream::BoxStream<'static, Result<BuildEvent, ClientError>>,
}

impl std::fmt::Debug for BuildStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildStream").finish_non_exhaustive()
    }
}

impl BuildStream {
    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<BuildEvent, ClientError>> {
        futures::StreamExt::next(&mut self.inner).await
    }

    /// Reads the log to its end, handing every event to `on_event`; returns the image made.
    /// An `error` event becomes [`ClientError::Api`] (status 0: the log had already begun).
    pub async fn finish(
        mut self,
        mut on_event: impl FnMut(&BuildEvent),
    ) -> Result<ImageInfo, ClientError> {
        while let Some(ev) = self.next().await {
            let ev = ev?;
            on_event(&ev);
            match ev {
                BuildEvent::Result { image, .. } => return Ok(*image),
                BuildEvent::Error { code, message, .. } => {
                    return Err(ClientError::Api {
                        status: 0,
                        error: warren_types::ApiError::new(code, message),
                    })
                }
                _ => {}
            }
        }
        Err(ClientError::Protocol(
            "the build log ended without a result".into(),
        ))
    }
}
