//! E2B's control plane: each handler parses E2B's request, makes the v1 calls that do it
//! ([`crate::native`]) and answers in E2B's shape. Nothing here runs a sandbox itself.
//!
//! On a gateway, the per-sandbox routes never reach these handlers: the front forwards them
//! to the node that holds the sandbox (which checks and answers them with its own token
//! secret); creates, listings and templates are answered here through the gateway's v1 API.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::DeserializeOwned;
use warren_types::{
    AllowRule, CreateSandboxRequest, ForkResult, NetworkMode, NetworkPolicy, Ports, Protocol,
    SandboxInfo, SandboxState, SnapshotInfo, SnapshotList,
};

use crate::convert::{self, Template};
use crate::error::{E2bError, E2bResult};
use crate::native::Principal;
use crate::{wire, E2b};

/// Largest control-plane request body.
const MAX_BODY: usize = 1 << 20;
/// E2B's default sandbox timeout, seconds.
pub const DEFAULT_TIMEOUT: u64 = 300;

/// The `{id}` of a per-sandbox route, checked to be a sandbox id. Axum decodes the segment,
/// so `n1-x%2Ffiles%3Fpath%3D%2Fetc` would otherwise splice another v1 route and query into
/// the calls made with it (`GET /v1/sandboxes/n1-x/files?path=/etc`); anything that is not a
/// sandbox id is E2B's 404, and a segment that is not UTF-8 E2B's 400.
#[derive(Debug, Clone)]
pub struct SandboxPath(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SandboxPath {
    type Rejection = E2bError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, E2bError> {
        let id = segment(parts, state).await?;
        match id.parse::<warren_types::SandboxId>() {
            Ok(_) => Ok(SandboxPath(id)),
            Err(_) => Err(E2bError::NotFound(format!(
                "sandbox {id:?} not found (not a sandbox id)"
            ))),
        }
    }
}

/// The `{id}` of `/templates/{id}` (a snapshot id or an image, read by
/// [`convert::template`]).
#[derive(Debug, Clone)]
pub struct TemplatePath(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for TemplatePath {
    type Rejection = E2bError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, E2bError> {
        segment(parts, state).await.map(TemplatePath)
    }
}

/// The route's one `{id}` segment, decoded; one that is not UTF-8 is E2B's 400.
async fn segment<S: Send + Sync>(
    parts: &mut axum::http::request::Parts,
    state: &S,
) -> Result<String, E2bError> {
    use axum::extract::FromRequestParts;
    let Path(id) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|e| E2bError::BadRequest(format!("bad id in the path: {}", e.body_text())))?;
    Ok(id)
}

/// A request body of at most [`MAX_BODY`] bytes; a longer one is E2B's `413`, a body that
/// breaks off its `400` (never axum's plain-text rejections).
#[derive(Debug, Clone)]
pub struct Body(pub Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body {
    type Rejection = E2bError;

    async fn from_request(req: Request, _: &S) -> Result<Self, E2bError> {
        use http_body_util::BodyExt;
        match http_body_util::Limited::new(req.into_body(), MAX_BODY)
            .collect()
            .await
        {
            Ok(c) => Ok(Body(c.to_bytes())),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(E2bError::TooLarge(
                format!("the body is larger than {MAX_BODY} bytes"),
            )),
            Err(e) => Err(E2bError::BadRequest(format!("reading the body: {e}"))),
        }
    }
}

/// Reads a JSON body; an empty one is `T::default()` where the route allows it.
fn json<T: DeserializeOwned>(body: &Bytes, empty: Option<T>) -> E2bResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return empty.ok_or_else(|| E2bError::BadRequest("a JSON body is required".into()));
    }
    if body.len() > MAX_BODY {
        return Err(E2bError::BadRequest(format!(
            "the body is {} bytes; at most {MAX_BODY}",
            body.len()
        )));
    }
    serde_json::from_slice(body).map_err(|e| E2bError::BadRequest(format!("bad JSON body: {e}")))
}

/// A timeout in seconds: positive, at most a year (the node caps it further).
fn seconds(what: &str, v: i64) -> E2bResult<u64> {
    if v <= 0 || v > 366 * 24 * 3600 {
        return Err(E2bError::BadRequest(format!(
            "{what} must be a positive number of seconds, got {v}"
        )));
    }
    Ok(v as u64)
}

fn is_set(v: &Option<serde_json::Value>) -> bool {
    match v {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Object(m)) => !m.is_empty(),
        Some(serde_json::Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

/// E2B's create as Warren's.
pub fn create_request(n: wire::NewSandbox, key: Option<String>) -> E2bResult<CreateSandboxRequest> {
    if n.template_id.trim().is_empty() {
        return Err(E2bError::BadRequest("templateID must not be empty".into()));
    }
    for (what, set) in [
        ("mcp", is_set(&n.mcp)),
        ("iam", is_set(&n.iam)),
        (
            "volumeMounts",
            n.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()),
        ),
        ("autoResume", is_set(&n.auto_resume)),
    ] {
        if set {
            return Err(E2bError::BadRequest(format!(
                "{what} is not supported by Warren's E2B API (see docs/e2b.md)"
            )));
        }
    }
    if n.auto_pause == Some(true) {
        return Err(E2bError::BadRequest(
            "autoPause is not supported: a Warren sandbox is deleted when its timeout ends; \
             pause it yourself (Sandbox.pause) and it keeps its files and processes"
                .into(),
        ));
    }
    if let Some(serde_json::Value::Object(net)) = &n.network {
        // Public traffic to the sandbox's ports is what Warren does; nothing else is offered.
        let offered = |k: &str, v: &serde_json::Value| {
            v.is_null() || (k == "allowPublicTraffic" && v.as_bool() != Some(false))
        };
        if let Some((k, _)) = net.iter().find(|(k, v)| !offered(k, v)) {
            return Err(E2bError::BadRequest(format!(
                "network.{k} is not supported: use allowInternetAccess, or Warren's network \
                 policies (PUT /v1/sandboxes/{{id}}/network)"
            )));
        }
    }
    let ttl = seconds("timeout", n.timeout.unwrap_or(DEFAULT_TIMEOUT as i64))?;
    let network = match n.allow_internet_access {
        Some(true) => NetworkPolicy {
            mode: NetworkMode::Allow,
            allow: vec![AllowRule {
                cidr: "0.0.0.0/0".into(),
                ports: Ports::Any,
                protocol: Protocol::Any,
            }],
            ..NetworkPolicy::default()
        },
        _ => NetworkPolicy::default(),
    };
    let mut req = CreateSandboxRequest {
        env: n.env_vars.unwrap_or_default(),
        labels: n.metadata.unwrap_or_default(),
        ttl_secs: Some(ttl),
        idempotency_key: key,
        network,
        ..CreateSandboxRequest::default()
    };
    match convert::template(&n.template_id) {
        Template::Image(image) => req.image = image,
        Template::Snapshot(s) => req.snapshot = Some(s.as_str().to_string()),
    }
    Ok(req)
}

/// `POST /sandboxes`, `POST /v2/sandboxes`.
pub async fn create(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    headers: HeaderMap,
    Body(body): Body,
) -> E2bResult<Response> {
    let n: wire::NewSandbox = json(&body, None)?;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let req = create_request(n, key)?;
    let (_, info): (_, SandboxInfo) = e2b
        .native()
        .call(&who, Method::POST, "/v1/sandboxes", Some(&req))
        .await
        .map_err(template_not_found)?;
    match e2b.created(&who, &info, &headers).await {
        Ok(sandbox) => Ok((StatusCode::CREATED, Json(sandbox)).into_response()),
        Err(e) => {
            // The client never learns this sandbox's id, so nothing would delete it before
            // its timeout; with an idempotency key a retry reaches it, so it stays.
            if req.idempotency_key.is_none() {
                discard(&e2b, &who, &info.id, &e).await;
            }
            Err(e)
        }
    }
}

/// Deletes a sandbox whose create or fork answered an error after it was made (a gateway
/// that could not fetch its token from its node, a fork child whose timeout could not be
/// set): the error answer carries no id, so the caller could not delete it.
async fn discard(e2b: &E2b, who: &Principal, id: &str, why: &E2bError) {
    let gone = e2b
        .native()
        .call_unit(who, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await;
    match gone {
        Ok(_) => {
            tracing::info!(sandbox = id, error = %why, "deleted a sandbox whose creation answered an error")
        }
        Err(e) => {
            tracing::warn!(sandbox = id, error = %why, delete = %e, "a sandbox whose creation answered an error could not be deleted; its timeout ends it")
        }
    }
    e2b.forget(id);
}

/// An unknown image or snapshot is E2B's 404 with a message naming the template.
fn template_not_found(e: E2bError) -> E2bError {
    match &e {
        E2bError::Native {
            status: 404,
            message,
            ..
        } => E2bError::NotFound(format!("template not found: {message}")),
        _ => e,
    }
}

/// The v1 record of one sandbox; a stopped or failed one is not found, as in E2B.
pub async fn info(e2b: &E2b, who: &Principal, id: &str) -> E2bResult<SandboxInfo> {
    let (_, info): (_, SandboxInfo) = e2b
        .native()
        .call(
            who,
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            None::<&()>,
        )
        .await
        .map_err(not_found(id))?;
    if convert::state(info.state).is_none() {
        return Err(E2bError::NotFound(format!(
            "sandbox {id} not found ({})",
            info.state.as_str()
        )));
    }
    Ok(info)
}

/// Turns a v1 `404` into E2B's sandbox-not-found.
fn not_found(id: &str) -> impl Fn(E2bError) -> E2bError + '_ {
    move |e| match e {
        E2bError::Native { status: 404, .. } => {
            E2bError::NotFound(format!("sandbox {id} not found"))
        }
        e => e,
    }
}

/// `GET /sandboxes/{id}`.
pub async fn get(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
) -> E2bResult<Json<wire::SandboxDetail>> {
    let info = info(&e2b, &who, &id).await?;
    convert::detail(&info, &e2b.extras(&info.id))
        .map(Json)
        .ok_or_else(|| E2bError::NotFound(format!("sandbox {id} not found")))
}

/// `DELETE /sandboxes/{id}`.
pub async fn kill(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
) -> E2bResult<StatusCode> {
    e2b.native()
        .call_unit(&who, Method::DELETE, &format!("/v1/sandboxes/{id}"), None)
        .await
        .map_err(not_found(&id))?;
    e2b.forget(&id);
    Ok(StatusCode::NO_CONTENT)
}

async fn extend(e2b: &E2b, who: &Principal, id: &str, secs: u64) -> E2bResult<SandboxInfo> {
    let (_, info) = e2b
        .native()
        .call(
            who,
            Method::POST,
            &format!("/v1/sandboxes/{id}/extend"),
            Some(&serde_json::json!({ "ttl_secs": secs })),
        )
        .await
        .map_err(not_found(id))?;
    Ok(info)
}

/// Makes the sandbox live at least `secs` from now (never shortens its life).
async fn keep_alive(e2b: &E2b, who: &Principal, info: &SandboxInfo, secs: u64) -> E2bResult<()> {
    let wanted = now_ms() + secs * 1000;
    if info.expires_at_ms.is_some_and(|e| e < wanted) {
        extend(e2b, who, &info.id, secs).await?;
    }
    Ok(())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
pub async fn set_timeout(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    Body(body): Body,
) -> E2bResult<StatusCode> {
    let t: wire::TimeoutRequest = json(&body, None)?;
    let secs = seconds("timeout", t.timeout)?;
    info(&e2b, &who, &id).await?;
    extend(&e2b, &who, &id, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes`: keeps the sandbox alive `duration` seconds more.
pub async fn refresh(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    Body(body): Body,
) -> E2bResult<StatusCode> {
    let r: wire::RefreshRequest = json(&body, Some(wire::RefreshRequest::default()))?;
    let secs = seconds("duration", r.duration.unwrap_or(DEFAULT_TIMEOUT as i64))?;
    let info = info(&e2b, &who, &id).await?;
    keep_alive(&e2b, &who, &info, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: `409` when it is paused already.
pub async fn pause(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    Body(body): Body,
) -> E2bResult<StatusCode> {
    let _: wire::PauseRequest = json(&body, Some(wire::PauseRequest::default()))?;
    let info = info(&e2b, &who, &id).await?;
    if info.state == SandboxState::Paused {
        return Err(E2bError::Conflict(format!(
            "sandbox {id} is already paused"
        )));
    }
    e2b.native()
        .call_unit(
            &who,
            Method::POST,
            &format!("/v1/sandboxes/{id}/pause"),
            None,
        )
        .await
        .map_err(not_found(&id))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (older SDKs): `409` when it is running.
pub async fn resume(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    Body(body): Body,
) -> E2bResult<Response> {
    let c: wire::ConnectRequest = json(&body, Some(wire::ConnectRequest::default()))?;
    let info = info(&e2b, &who, &id).await?;
    if info.state != SandboxState::Paused {
        return Err(E2bError::Conflict(format!("sandbox {id} is not paused")));
    }
    let (status, sandbox) = wake(&e2b, &who, info, c, &headers).await?;
    Ok((status, Json(sandbox)).into_response())
}

/// `POST /sandboxes/{id}/connect` and `/v2/sandboxes/{id}/connect`: a paused sandbox is
/// resumed (`201`), a running one answered as it is (`200`).
pub async fn connect(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    Body(body): Body,
) -> E2bResult<Response> {
    let c: wire::ConnectRequest = json(&body, Some(wire::ConnectRequest::default()))?;
    let info = info(&e2b, &who, &id).await?;
    let (status, sandbox) = wake(&e2b, &who, info, c, &headers).await?;
    Ok((status, Json(sandbox)).into_response())
}

async fn wake(
    e2b: &E2b,
    who: &Principal,
    mut info: SandboxInfo,
    c: wire::ConnectRequest,
    headers: &HeaderMap,
) -> E2bResult<(StatusCode, wire::Sandbox)> {
    if c.auto_pause == Some(true) {
        return Err(E2bError::BadRequest("autoPause is not supported".into()));
    }
    let timeout = c.timeout.map(|t| seconds("timeout", t)).transpose()?;
    let mut status = StatusCode::OK;
    if info.state == SandboxState::Paused {
        let (_, resumed): (_, SandboxInfo) = e2b
            .native()
            .call(
                who,
                Method::POST,
                &format!("/v1/sandboxes/{}/resume", info.id),
                None::<&()>,
            )
            .await
            .map_err(not_found(&info.id))?;
        info = resumed;
        status = StatusCode::CREATED;
    }
    if let Some(secs) = timeout {
        keep_alive(e2b, who, &info, secs).await?;
    }
    Ok((status, e2b.created(who, &info, headers).await?))
}

/// `POST /sandboxes/{id}/snapshots`.
pub async fn snapshot(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    Body(body): Body,
) -> E2bResult<Response> {
    let r: wire::SnapshotRequest = json(&body, Some(wire::SnapshotRequest::default()))?;
    let mut labels = BTreeMap::new();
    if let Some(name) = r.name.filter(|n| !n.is_empty()) {
        labels.insert(SNAPSHOT_NAME.to_string(), name);
    }
    let (_, s): (_, SnapshotInfo) = e2b
        .native()
        .call(
            &who,
            Method::POST,
            &format!("/v1/sandboxes/{id}/snapshot"),
            Some(&serde_json::json!({ "labels": labels })),
        )
        .await
        .map_err(not_found(&id))?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&s))).into_response())
}

/// The label that holds an E2B snapshot's name.
const SNAPSHOT_NAME: &str = "e2b.name";

fn snapshot_info(s: &SnapshotInfo) -> wire::SnapshotInfo {
    wire::SnapshotInfo {
        snapshot_id: s.id.clone(),
        names: s.labels.get(SNAPSHOT_NAME).cloned().into_iter().collect(),
    }
}

/// `GET /snapshots` (`sandboxID`, `name` filters; one page).
pub async fn snapshots(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Vec<wire::SnapshotInfo>>> {
    let q = crate::list::pairs(q.as_deref());
    let (_, list): (_, SnapshotList) = e2b
        .native()
        .call(&who, Method::GET, "/v1/snapshots", None::<&()>)
        .await?;
    let sandbox = q.get("sandboxID");
    let name = q.get("name");
    Ok(Json(
        list.snapshots
            .iter()
            .filter(|s| sandbox.is_none_or(|id| &s.sandbox == id))
            .filter(|s| name.is_none_or(|n| s.labels.get(SNAPSHOT_NAME) == Some(n)))
            .map(snapshot_info)
            .collect(),
    ))
}

/// `DELETE /templates/{id}`: deletes a snapshot; images are not deleted through E2B.
pub async fn delete_template(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    TemplatePath(id): TemplatePath,
) -> E2bResult<StatusCode> {
    match convert::template(&id) {
        Template::Snapshot(s) => {
            e2b.native()
                .call_unit(&who, Method::DELETE, &format!("/v1/snapshots/{s}"), None)
                .await
                .map_err(|e| match e {
                    E2bError::Native { status: 404, .. } => {
                        E2bError::NotFound(format!("snapshot {id} not found"))
                    }
                    e => e,
                })?;
            Ok(StatusCode::NO_CONTENT)
        }
        Template::Image(_) => Err(E2bError::Unsupported(
            "templates are Warren images: delete them with `warren image rm` (DELETE /v1/images/{ref})"
                .into(),
        )),
    }
}

/// `POST /sandboxes/{id}/fork`: `count` children, each a sandbox or an error.
pub async fn fork(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    Body(body): Body,
) -> E2bResult<Response> {
    let f: wire::ForkRequest = json(&body, Some(wire::ForkRequest::default()))?;
    let n = f.count.unwrap_or(1);
    if !(1..=warren_types::sandbox::MAX_FORK as i64).contains(&n) {
        return Err(E2bError::BadRequest(format!(
            "count must be between 1 and {}",
            warren_types::sandbox::MAX_FORK
        )));
    }
    let timeout = f.timeout.map(|t| seconds("timeout", t)).transpose()?;
    let (_, done): (_, ForkResult) = e2b
        .native()
        .call(
            &who,
            Method::POST,
            &format!("/v1/sandboxes/{id}/fork"),
            Some(&serde_json::json!({ "n": n })),
        )
        .await
        .map_err(not_found(&id))?;
    let mut out = Vec::new();
    for child in done.sandboxes {
        let r = async {
            if let Some(secs) = timeout {
                extend(&e2b, &who, &child.id, secs).await?;
            }
            e2b.created(&who, &child, &headers).await
        }
        .await;
        if let Err(e) = &r {
            discard(&e2b, &who, &child.id, e).await;
        }
        out.push(match r {
            Ok(s) => wire::ForkResult {
                sandbox: Some(s),
                error: None,
            },
            Err(e) => wire::ForkResult {
                sandbox: None,
                error: Some(wire::Error {
                    code: e.status().as_u16(),
                    message: e.to_string(),
                }),
            },
        });
    }
    Ok((StatusCode::CREATED, Json(out)).into_response())
}

/// `GET /templates`: the images the caller may use.
pub async fn templates(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
) -> E2bResult<Json<Vec<wire::Template>>> {
    #[derive(serde::Deserialize)]
    struct ImageList {
        images: Vec<warren_types::ImageInfo>,
    }
    let (_, ImageList { images }) = e2b
        .native()
        .call(&who, Method::GET, "/v1/images", None::<&()>)
        .await?;
    let d = warren_types::Limits::default();
    Ok(Json(
        images
            .iter()
            .map(|i| {
                let id = convert::template_id(std::slice::from_ref(&i.reference));
                let t = convert::rfc3339(i.created_ms);
                wire::Template {
                    template_id: id.clone(),
                    build_id: i
                        .layers
                        .last()
                        .map(|l| l.digest.clone())
                        .unwrap_or_default(),
                    cpu_count: d.cpus as u64,
                    memory_mb: d.memory_mb,
                    disk_size_mb: d.disk_mb,
                    public: i.owner.is_none(),
                    aliases: vec![id.clone()],
                    names: vec![id],
                    created_at: t.clone(),
                    updated_at: t,
                    created_by: None,
                    last_spawned_at: None,
                    spawn_count: 0,
                    build_count: 1,
                    envd_version: e2b.envd_version().into(),
                    build_status: "ready".into(),
                }
            })
            .collect(),
    ))
}

/// Routes of E2B's API that Warren does not offer: `501` in E2B's shape.
pub async fn unsupported(req: Request) -> E2bError {
    E2bError::Unsupported(format!(
        "{} {} is not offered by Warren's E2B API (docs/e2b.md lists what is)",
        req.method(),
        req.uri().path()
    ))
}

/// No such route.
pub async fn no_route(req: Request) -> E2bError {
    E2bError::NotFound(format!("no route {} {}", req.method(), req.uri().path()))
}
