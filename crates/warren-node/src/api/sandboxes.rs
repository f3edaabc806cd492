//! Node and lifecycle routes: health, metrics, create, list, get, delete, pause, resume, fork,
//! revive.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use warren_types::{
    ApiError, CreateSandboxRequest, ForkRequest, ForkResult, PauseStats, ReviveOptions, SandboxId,
    SandboxInfo, SandboxState, Substrate,
};

use super::error::{HttpError, HttpResult};
use super::extract::{Auth, JsonBody, QueryPairs, RawSandboxParam, SandboxParam};
use crate::manager::{ListFilter, Manager, Telemetry, Trajectories};
use crate::node::Node;

/// `GET /v1/health`.
#[derive(Debug, Serialize)]
pub struct Health {
    pub status: &'static str,
    pub node: String,
    pub version: &'static str,
    pub substrates: Vec<&'static str>,
    /// Sandboxes on the node; a user token's tenant's only.
    pub sandboxes: usize,
    /// seccomp, Landlock (ABI and what is enforced) and AppArmor on this node.
    pub security: warren_runtime::security::SecurityReport,
    /// The state file: its size and the limit beyond which no output is kept.
    pub state: StateUsage,
    /// What the node applies when a request leaves it out.
    pub defaults: NodeDefaults,
    /// Sandboxes by state and substrate, memory and CPU pressure (what a gateway places by);
    /// administrators only (it counts every tenant's sandboxes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<warren_types::NodeLoad>,
    /// The host: memory and CPU time so far (a client takes two readings for a CPU share).
    pub host: HostUsage,
    /// The writable-layer space on disk of the node's containers; `null` where the node
    /// keeps writable layers in memory only.
    pub disk: Option<warren_runtime::container::WritableSpace>,
    /// Who the node took the caller for (the dashboard offers changes to admins only).
    pub caller: warren_types::CallerSummary,
}

/// `host` of `/v1/health`.
#[derive(Debug, Serialize)]
pub struct HostUsage {
    pub memory_total_mb: u64,
    pub cpus: usize,
    /// CPU time of the whole host since boot, busy and in all, in milliseconds
    /// (`/proc/stat`); `null` where it cannot be read.
    pub cpu_busy_ms: Option<u64>,
    pub cpu_total_ms: Option<u64>,
}

impl HostUsage {
    pub(super) fn read(memory_total_mb: u64) -> HostUsage {
        let (busy, total) = match host_cpu_ms() {
            Some((b, t)) => (Some(b), Some(t)),
            None => (None, None),
        };
        HostUsage {
            memory_total_mb,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_busy_ms: busy,
            cpu_total_ms: total,
        }
    }
}

/// `(busy, total)` CPU time of the host from the first line of `/proc/stat`, in ms.
fn host_cpu_ms() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    parse_proc_stat(&text)
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal ... in
/// USER_HZ (100 on every Linux ABI Warren runs on). Idle and iowait are not busy.
fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    if ticks.len() < 5 {
        return None;
    }
    let total: u64 = ticks.iter().sum();
    let idle = ticks[3] + ticks[4];
    Some(((total - idle) * 10, total * 10))
}

/// `state` of `/v1/health`.
#[derive(Debug, Serialize)]
pub struct StateUsage {
    /// Administrators only: outputs are stored once per content, so the size would tell a
    /// tenant whether another printed the same output.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub max_bytes: u64,
    /// True once `bytes` reached `max_bytes`: trajectories keep digests and sizes only.
    pub full: bool,
}

/// `defaults` of `/v1/health`.
#[derive(Debug, Serialize)]
pub struct NodeDefaults {
    /// Lifetime of a sandbox created without `ttl_secs` (none: it lives until deleted).
    pub ttl_secs: Option<u64>,
    /// Longest lifetime a create or an extension may give.
    pub max_ttl_secs: u64,
    /// Timeout of a command whose exec request names none.
    pub exec_timeout_secs: Option<f64>,
}

pub async fn health(
    State(m): State<Manager>,
    State(telemetry): State<Telemetry>,
    Auth(caller): Auth,
) -> Json<Health> {
    // A user token sees its tenant's count and nothing summed over other tenants.
    let admin = caller.is_admin();
    let sandboxes = if admin {
        m.count()
    } else {
        m.list(&ListFilter {
            tenant: caller.scope().map(str::to_string),
            ..ListFilter::default()
        })
        .len()
    };
    Json(Health {
        status: "ok",
        node: m.config().node.to_string(),
        version: env!("CARGO_PKG_VERSION"),
        substrates: m.substrates().served().iter().map(|s| s.as_str()).collect(),
        sandboxes,
        security: m.config().security.clone(),
        state: {
            let (bytes, max_bytes) = telemetry.state_usage(&m);
            StateUsage {
                bytes: admin.then_some(bytes),
                max_bytes,
                full: bytes >= max_bytes,
            }
        },
        defaults: NodeDefaults {
            ttl_secs: m.config().ttl_for(None),
            max_ttl_secs: m.config().ttl_cap(),
            exec_timeout_secs: m.config().default_exec_timeout_secs,
        },
        load: admin.then(|| telemetry.load(&m)),
        host: HostUsage::read(telemetry.capacity(&m).memory_total_mb),
        disk: m
            .substrates()
            .runtimes()
            .iter()
            .find_map(|r| r.writable_space()),
        caller: caller.summary(),
    })
}

pub async fn metrics(State(node): State<Node>, Auth(caller): Auth) -> HttpResult<Response> {
    caller.require_admin("GET /metrics")?;
    Ok((
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        node.render_metrics(),
    )
        .into_response())
}

pub async fn create(
    State(m): State<Manager>,
    State(images): State<crate::images::Images>,
    Auth(caller): Auth,
    JsonBody(req): JsonBody<CreateSandboxRequest>,
) -> HttpResult<Response> {
    images
        .check_usable(&caller, &req.image.refs(), crate::images::Usage::Create)
        .await?;
    // Runs to its end even if the client goes away (see `Manager::create_as`).
    let created = m.create_as(&caller, req).await?;
    let status = if created.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(created.info)).into_response())
}

/// `POST /v1/sandboxes/{id}/extend` body.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    pub ttl_secs: u64,
}

pub async fn extend(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    JsonBody(req): JsonBody<ExtendRequest>,
) -> HttpResult<Json<SandboxInfo>> {
    Ok(Json(m.extend(&id, req.ttl_secs).await?))
}

/// `GET /v1/sandboxes/{id}/stats`: resource use now (read from outside; a paused sandbox
/// stays paused).
pub async fn stats(
    State(m): State<Manager>,
    State(telemetry): State<Telemetry>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Json<warren_types::SandboxStats>> {
    q.only(&[], &[])?;
    Ok(Json(telemetry.stats(&m, &id)?))
}

#[derive(Debug, Serialize)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxInfo>,
    /// Set when `limit` cut the list: pass it as `after` for the next page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `?limit=N&after=ID`: a page of a listing in [`SandboxId::order_key`] order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Page {
    pub limit: Option<usize>,
    pub after: Option<SandboxId>,
}

pub(crate) fn page(q: &QueryPairs) -> Result<Page, HttpError> {
    let limit = q
        .get("limit")
        .map(|l| match l.parse::<usize>() {
            Ok(n) if (1..=100_000).contains(&n) => Ok(n),
            _ => Err(HttpError::invalid(format!(
                "limit must be 1 to 100000, got {l:?}"
            ))),
        })
        .transpose()?;
    let after = q
        .get("after")
        .map(|a| {
            a.parse::<SandboxId>()
                .map_err(|e| HttpError::invalid(format!("after: {e}")))
        })
        .transpose()?;
    Ok(Page { limit, after })
}

/// Cuts `all` (in id order, from one node) to the page.
fn paginate(mut all: Vec<SandboxInfo>, page: &Page) -> SandboxList {
    if let Some(after) = &page.after {
        let key = after.order_key();
        all.retain(|sb| {
            sb.id
                .parse::<SandboxId>()
                .map(|id| id.order_key() > key)
                .unwrap_or(true)
        });
    }
    let mut next_after = None;
    if let Some(limit) = page.limit {
        if all.len() > limit {
            all.truncate(limit);
            next_after = all.last().map(|sb| sb.id.clone());
        }
    }
    SandboxList {
        sandboxes: all,
        next_after,
    }
}

/// Parses `?label=k=v&label=k2=v2&state=running`.
pub(crate) fn list_filter(q: &QueryPairs) -> Result<ListFilter, HttpError> {
    q.only(
        &["label", "state", "substrate", "limit", "after"],
        &["label"],
    )?;
    let mut filter = ListFilter::default();
    for l in q.all("label") {
        let (k, v) = l.split_once('=').ok_or_else(|| {
            HttpError::invalid(format!("label filter must be key=value, got {l:?}"))
        })?;
        filter.labels.insert(k.to_string(), v.to_string());
    }
    if let Some(s) = q.get("state") {
        filter.state = Some(SandboxState::parse(s).ok_or_else(|| {
            HttpError::invalid(format!(
                "state must be one of creating, running, paused, stopped, failed; got {s:?}"
            ))
        })?);
    }
    if let Some(s) = q.get("substrate") {
        filter.substrate = Some(
            [
                Substrate::Function,
                Substrate::Container,
                Substrate::Microvm,
                Substrate::Vm,
            ]
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| {
                HttpError::invalid(format!(
                    "substrate must be one of function, container, microvm, vm; got {s:?}"
                ))
            })?,
        );
    }
    Ok(filter)
}

pub async fn list(
    State(m): State<Manager>,
    Auth(caller): Auth,
    q: QueryPairs,
) -> HttpResult<Json<SandboxList>> {
    let mut filter = list_filter(&q)?;
    filter.tenant = caller.scope().map(str::to_string);
    let page = page(&q)?;
    Ok(Json(paginate(m.list(&filter), &page)))
}

pub async fn get(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<SandboxInfo>> {
    Ok(Json(m.get(&id)?))
}

pub async fn delete(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<StatusCode> {
    // Like create: a delete, once started, finishes even if the client disconnects.
    tokio::spawn(async move { m.delete(&id).await })
        .await
        .map_err(|e| ApiError::internal(format!("delete task: {e}")))??;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs a lifecycle call in its own task: once started it finishes even if the client goes
/// away (a pause or fork cut off half-way would leave the sandbox between states).
pub(super) async fn detached<T: Send + 'static>(
    what: &'static str,
    f: impl std::future::Future<Output = Result<T, crate::NodeError>> + Send + 'static,
) -> HttpResult<T> {
    Ok(tokio::spawn(f)
        .await
        .map_err(|e| ApiError::internal(format!("{what} task: {e}")))??)
}

pub async fn pause(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<PauseStats>> {
    Ok(Json(
        detached("pause", async move { m.pause(&id).await }).await?,
    ))
}

pub async fn resume(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
) -> HttpResult<Json<SandboxInfo>> {
    Ok(Json(
        detached("resume", async move { m.resume(&id).await }).await?,
    ))
}

pub async fn fork(
    State(m): State<Manager>,
    Auth(caller): Auth,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
    JsonBody(req): JsonBody<ForkRequest>,
) -> HttpResult<Response> {
    let step = q.only_step()?;
    let done = detached(
        "fork",
        async move { m.fork_step(&caller, &id, req, step).await },
    )
    .await?;
    let resp = (
        StatusCode::CREATED,
        Json(ForkResult {
            sandboxes: done.answer,
        }),
    )
        .into_response();
    Ok(super::exec::mark_replayed(resp, done.replayed))
}

/// `POST /v1/sandboxes/{id}/revive[?stop_on_divergence=true]`: a new sandbox with the
/// logged sandbox's calls run again (see `Trajectories::revive_as`). The id need not name
/// a sandbox of this node: it looks for its log (and checks the tenant) itself.
pub async fn revive(
    State(m): State<Manager>,
    State(trajectories): State<Trajectories>,
    Auth(caller): Auth,
    RawSandboxParam(id): RawSandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    q.only(&["stop_on_divergence"], &[])?;
    let opts = ReviveOptions {
        stop_on_divergence: q.flag("stop_on_divergence")?,
    };
    let report = detached("revive", async move {
        trajectories.revive_as(&m, &caller, &id, opts).await
    })
    .await?;
    Ok((StatusCode::CREATED, Json(report)).into_response())
}

#[cfg(test)]
mod proc_stat_tests {
    use super::parse_proc_stat;

    #[test]
    fn busy_and_total_from_the_cpu_line() {
        let text = "cpu  100 5 50 800 20 3 2 0 0 0\ncpu0 50 2 25 400 10 1 1 0 0 0\n";
        // busy = user + nice + system + irq + softirq + steal = 160 ticks; total 980.
        assert_eq!(parse_proc_stat(text), Some((1600, 9800)));
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 x 3 4 5\n"), None);
    }
}
