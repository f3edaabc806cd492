//! Image routes: list, inspect, delete, collect.

use axum::extract::RawPathParams;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::Json;
use serde::Serialize;
use warren_types::{GcReport, ImageDeleted, ImageImported, ImageInfo, PullRequest};

use super::error::{HttpError, HttpResult};
use super::extract::{Auth, JsonBody, QueryPairs, RawBody};
use crate::builds::Builds;
use crate::images::Images;

/// `{ref}` of `/v1/images/{ref}`: `name[:tag]` (layer digests are not images).
#[derive(Debug)]
pub struct ImageParam(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ImageParam {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        let raw = RawPathParams::from_request_parts(parts, &())
            .await
            .map_err(|e| HttpError::invalid(format!("bad path: {e}")))?;
        let r = raw
            .iter()
            .find(|(k, _)| *k == "ref")
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| HttpError::invalid("missing path parameter ref"))?;
        if r.starts_with("sha256:") {
            return Err(HttpError::invalid(format!(
                "{r} is a layer digest; name an image (name[:tag])"
            )));
        }
        warren_types::validate::image_ref(&r)?;
        Ok(ImageParam(r))
    }
}

/// `GET /v1/images`.
#[derive(Debug, Serialize)]
pub struct ImageList {
    pub images: Vec<ImageInfo>,
}

/// The node's own images and the caller's tenant's.
pub async fn list(State(images): State<Images>, Auth(caller): Auth) -> HttpResult<Json<ImageList>> {
    Ok(Json(ImageList {
        images: images.list(&caller).await?,
    }))
}

pub async fn get(
    State(images): State<Images>,
    Auth(caller): Auth,
    ImageParam(r): ImageParam,
) -> HttpResult<Json<ImageInfo>> {
    Ok(Json(images.get(&caller, &r).await?))
}

/// Images are node-wide: removing one needs the admin role.
pub async fn delete(
    State(images): State<Images>,
    Auth(caller): Auth,
    ImageParam(r): ImageParam,
) -> HttpResult<Json<ImageDeleted>> {
    caller.require_admin("deleting an image")?;
    Ok(Json(images.delete(&r).await?))
}

pub async fn gc(State(images): State<Images>, Auth(caller): Auth) -> HttpResult<Json<GcReport>> {
    caller.require_admin("collecting images")?;
    Ok(Json(images.gc().await?))
}

/// `POST /v1/images/import?tag=name[:tag][&force=true]`: the body is the archive. A tenant's
/// import belongs to it; a tag another owns is refused (409), and so is one that exists
/// unless `force`.
pub async fn import(
    State(images): State<Images>,
    Auth(caller): Auth,
    q: QueryPairs,
    body: RawBody,
) -> HttpResult<Json<ImageImported>> {
    q.only(&["tag", "force"], &[])?;
    let tag = q.get("tag").map(str::to_string);
    let force = q.flag("force")?;
    Ok(Json(
        images
            .import(
                &caller,
                tag,
                force,
                super::extract::non_empty(body, "an image archive").await?,
            )
            .await?,
    ))
}

/// `POST /v1/images/pull`: like import.
pub async fn pull(
    State(images): State<Images>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<PullRequest>,
) -> HttpResult<Json<ImageImported>> {
    Ok(Json(images.pull(&caller, req).await?))
}

/// `POST /v1/images/build?tag=…[&dockerfile=…][&build_arg=K=V]…[&target=…][&no_cache=true]
/// [&insecure=true][&network=none][&memory_mb=…][&cpus=…][&disk_mb=…][&step_timeout_secs=…]`: the body is
/// the build context as a tar; the answer streams the build's log as NDJSON
/// ([`warren_types::BuildEvent`]), ending with `result` or `error`.
pub async fn build(
    State(builds): State<Builds>,
    Auth(caller): Auth,
    q: QueryPairs,
    body: RawBody,
) -> HttpResult<axum::response::Response> {
    use axum::response::IntoResponse;
    q.only(
        &[
            "tag",
            "dockerfile",
            "build_arg",
            "target",
            "no_cache",
            "insecure",
            "network",
            "memory_mb",
            "cpus",
            "disk_mb",
            "step_timeout_secs",
        ],
        &["build_arg"],
    )?;
    let num = |k: &str| -> Result<Option<f64>, HttpError> {
        q.get(k)
            .map(|v| {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| {
                        HttpError::invalid(format!("{k}={v:?} is not a positive number"))
                    })
            })
            .transpose()
    };
    let mut build_args = std::collections::BTreeMap::new();
    for a in q.all("build_arg") {
        let (k, v) = a
            .split_once('=')
            .ok_or_else(|| HttpError::invalid(format!("build_arg={a:?}: expected KEY=VALUE")))?;
        build_args.insert(k.to_string(), v.to_string());
    }
    let opts = warren_types::BuildOptions {
        tag: q.required("tag")?.to_string(),
        dockerfile: q.get("dockerfile").map(str::to_string),
        build_args,
        target: q.get("target").map(str::to_string),
        no_cache: q.flag("no_cache")?,
        insecure: q.flag("insecure")?,
        network: q.get("network").map(str::to_string),
        memory_mb: num("memory_mb")?.map(|x| x as u64),
        cpus: num("cpus")?,
        disk_mb: num("disk_mb")?.map(|x| x as u64),
        step_timeout_secs: num("step_timeout_secs")?,
    };
    let body = super::extract::non_empty(body, "the build context as a tar").await?;
    let rx = builds.build(&caller, opts, body).await?;
    let lines = futures::stream::unfold(rx, |mut rx| async move {
        let ev = rx.recv().await?;
        let mut line = serde_json::to_vec(&ev).unwrap_or_default();
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)),
            rx,
        ))
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}
