//! E2B's API in front of Warren's: the control plane (E2B's REST API as the `e2b` SDKs call
//! it), the authentication of its API keys and envd access tokens, and the dispatch of every
//! request a server gets when it runs with `--e2b`.
//!
//! [`E2b::wrap`] puts one outer service in front of a server's whole app (the edge-protected
//! v1 API and the dashboard):
//!
//! - a request for a sandbox (`E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers, or the host
//!   `{port}-{id}.{domain}` with `--e2b-domain`; [`route`]) goes to envd
//!   ([`warren_envd::Envd::serve`]) when the port is envd's, else to the v1 port proxy
//!   (`/v1/sandboxes/{id}/ports/{port}/…`);
//! - Warren's routes (`/v1/…`, `/metrics`, `/ui`) go to the app unchanged;
//! - everything else is E2B's control plane ([`control`], [`list`]), authenticated by
//!   `X-API-Key`: a Warren token (the edge's [`warren_edge::Authenticator`]); without `--auth`
//!   any key, or none, is the administrator.
//!
//! Nothing here runs a sandbox: every call is a v1 call made in-process ([`native`]), so it
//! is authorized, limited and logged in the trajectory like a native one.
//!
//! On a node the front answers everything itself ([`E2b::node`]); it keeps the secret of the
//! envd access tokens ([`token`]). On a gateway ([`E2b::gateway`]) per-sandbox requests (the
//! data plane and `/sandboxes/{id}/…`) are forwarded unchanged to the node that holds the
//! sandbox, which checks them; creates are placed by the gateway's v1 API.

pub mod control;
pub mod convert;
pub mod error;
pub mod list;
pub mod native;
pub mod route;
pub mod token;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::Router;
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tower::ServiceExt;
use warren_edge::authn::Verdict;
use warren_edge::{Authenticator, Peer};
use warren_types::{Caller, Quotas, Role, SandboxId, SandboxInfo};

pub use error::{E2bError, E2bResult};
pub use native::{Native, Principal};
pub use route::ENVD_PORT;
pub use token::{Purpose, Tokens};

/// The command-line flags of the E2B front, for `#[command(flatten)]`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct E2bArgs {
    /// Also serve E2B's API (control plane, envd, sandbox ports) on the same listeners, so
    /// E2B's SDKs work unchanged (E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN); see docs/e2b.md.
    #[arg(long)]
    pub e2b: bool,
    /// Host names `{port}-{sandbox id}.DOMAIN` reach a port of a sandbox (what
    /// `sandbox.get_host(port)` answers); also answered as the sandboxes' `domain`.
    #[arg(long, requires = "e2b", value_name = "DOMAIN")]
    pub e2b_domain: Option<String>,
}

/// The envd version answered in `envdVersion`: the SDKs enable features by it.
pub use warren_envd::ENVD_VERSION;

/// The file in a node's state directory that holds the envd token secret.
pub const SECRET_FILE: &str = "e2b-secret";

/// Header of the envd access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";
/// Header of the API key.
pub const API_KEY_HEADER: &str = "x-api-key";

/// Forwards a request unchanged to the node that holds a sandbox (a gateway's proxy).
pub trait Owners: Send + Sync + 'static {
    fn forward(&self, sandbox: &SandboxId, req: Request) -> BoxFuture<'static, Response>;
}

/// Where per-sandbox requests are answered.
enum Place {
    /// Here: a node, with its token secret and envd.
    Local {
        tokens: Tokens,
        envd: warren_envd::Envd,
    },
    /// On the sandbox's node, reached through a gateway.
    Remote(Arc<dyn Owners>),
}

struct Inner {
    native: Native,
    auth: Arc<Authenticator>,
    domain: Option<String>,
    place: Place,
    /// Sandbox id → owning tenant, for data-plane requests (ids are never reused).
    tenants: Mutex<HashMap<String, Option<String>>>,
}

/// Most entries of the tenant cache before it is emptied.
const TENANT_CACHE: usize = 65_536;

/// The E2B front of one server. Cheap to clone.
#[derive(Clone)]
pub struct E2b {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for E2b {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2b")
            .field("domain", &self.inner.domain)
            .field("local", &matches!(self.inner.place, Place::Local { .. }))
            .finish_non_exhaustive()
    }
}

impl E2b {
    /// The front of a node. `native` is the node's v1 router without the edge's
    /// authentication; `auth` the edge's authenticator; `domain` the `--e2b-domain`.
    pub fn node(
        native: Router,
        auth: Arc<Authenticator>,
        tokens: Tokens,
        domain: Option<String>,
    ) -> E2b {
        let envd = warren_envd::Envd::new(native.clone());
        E2b::new(native, auth, domain, Place::Local { tokens, envd })
    }

    /// The front of a gateway: `native` is the gateway's router (without the edge), `owners`
    /// forwards per-sandbox requests to their node.
    pub fn gateway(
        native: Router,
        auth: Arc<Authenticator>,
        owners: Arc<dyn Owners>,
        domain: Option<String>,
    ) -> E2b {
        E2b::new(native, auth, domain, Place::Remote(owners))
    }

    fn new(native: Router, auth: Arc<Authenticator>, domain: Option<String>, place: Place) -> E2b {
        E2b {
            inner: Arc::new(Inner {
                native: Native::new(native),
                auth,
                domain: domain
                    .map(|d| d.trim_matches('.').to_ascii_lowercase())
                    .filter(|d| !d.is_empty()),
                place,
                tenants: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn native(&self) -> &Native {
        &self.inner.native
    }

    pub fn envd_version(&self) -> &'static str {
        ENVD_VERSION
    }

    /// `app` (the server's edge-protected API and dashboard) behind the E2B front.
    pub fn wrap(&self, app: Router) -> Router {
        let control = control_router(self.clone());
        Router::new().fallback(dispatch).with_state(Front {
            e2b: self.clone(),
            app,
            control,
        })
    }

    /// What a record of a local sandbox is answered with.
    pub fn extras(&self, id: &str) -> convert::Extras<'static> {
        convert::Extras {
            envd_version: ENVD_VERSION,
            envd_access_token: match &self.inner.place {
                Place::Local { tokens, .. } => Some(tokens.token(Purpose::Envd, id)),
                Place::Remote(_) => None,
            },
            domain: self.inner.domain.clone(),
        }
    }

    /// A created, connected or resumed sandbox in E2B's shape. On a gateway the token comes
    /// from the sandbox's node (its `GET /sandboxes/{id}`, with the caller's own headers).
    pub async fn created(
        &self,
        who: &Principal,
        info: &SandboxInfo,
        headers: &HeaderMap,
    ) -> E2bResult<wire::Sandbox> {
        let owners = match &self.inner.place {
            Place::Local { .. } => {
                // Its data-plane calls follow at once: they find the owner without a lookup.
                self.remember_owner(info);
                return Ok(convert::created(info, &self.extras(&info.id)));
            }
            Place::Remote(o) => o.clone(),
        };
        let id: SandboxId = info
            .id
            .parse()
            .map_err(|_| E2bError::Internal(format!("bad sandbox id {:?}", info.id)))?;
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(format!("/sandboxes/{id}"))
            .body(Body::empty())
            .map_err(|e| E2bError::Internal(e.to_string()))?;
        for h in [API_KEY_HEADER, "x-request-id"] {
            if let Some(v) = headers.get(h) {
                req.headers_mut().insert(h, v.clone());
            }
        }
        who.stamp(&mut req);
        let resp = owners.forward(&id, req).await;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| E2bError::Internal(e.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(E2bError::from_native(status, &body));
        }
        let d: wire::SandboxDetail = serde_json::from_slice(&body).map_err(|e| {
            E2bError::Internal(format!(
                "node of {id} answered no E2B sandbox (is it running with --e2b?): {e}"
            ))
        })?;
        Ok(wire::Sandbox {
            envd_access_token: d.envd_access_token,
            domain: d.domain.or_else(|| self.inner.domain.clone()),
            ..convert::created(info, &self.extras(&info.id))
        })
    }

    /// Drops what is kept about a sandbox that was deleted (here and in envd).
    pub fn forget(&self, id: &str) {
        self.inner.tenants.lock().expect("tenant cache").remove(id);
        if let Place::Local { envd, .. } = &self.inner.place {
            envd.forget(id);
        }
    }

    /// Who a request acts as, from its `X-API-Key`.
    async fn principal(
        &self,
        headers: &HeaderMap,
        peer: Option<Peer>,
    ) -> Result<Principal, E2bError> {
        let key = headers
            .get(API_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_string);
        let bearer = key
            .as_ref()
            .and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok());
        match self.inner.auth.caller(peer.as_ref(), bearer.as_ref()) {
            Verdict::Caller(caller) => Ok(Principal { caller, key }),
            Verdict::Missing => Err(E2bError::Unauthorized(
                "an API key is required: send X-API-Key with a Warren token (E2B_API_KEY)".into(),
            )),
            Verdict::Refused(delay) => {
                tracing::info!(peer = ?peer, delay_ms = delay.as_millis() as u64, "refused a bad E2B API key");
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Err(E2bError::Unauthorized(
                    "the API key is not valid (unknown, revoked or mistyped)".into(),
                ))
            }
        }
    }

    /// The tenant that owns a local sandbox; a `404` in E2B's shape when there is none.
    async fn owner(&self, id: &SandboxId) -> Result<Option<String>, E2bError> {
        if let Some(t) = self
            .inner
            .tenants
            .lock()
            .expect("tenant cache")
            .get(id.as_str())
        {
            return Ok(t.clone());
        }
        let admin = Principal {
            caller: Caller::admin(),
            key: None,
        };
        let info = control::info(self, &admin, id.as_str()).await?;
        self.remember_owner(&info);
        Ok(info.tenant)
    }

    /// Keeps the owner of a local sandbox for its data-plane requests.
    fn remember_owner(&self, info: &SandboxInfo) {
        let mut cache = self.inner.tenants.lock().expect("tenant cache");
        if cache.len() >= TENANT_CACHE {
            cache.clear();
        }
        cache.insert(info.id.clone(), info.tenant.clone());
    }

    /// A request to a port of a sandbox held here.
    async fn local_sandbox(
        &self,
        tokens: &Tokens,
        envd: &warren_envd::Envd,
        id: SandboxId,
        port: u16,
        mut req: Request,
    ) -> Result<Response, E2bError> {
        let token = req
            .headers()
            .get(ACCESS_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if port == ENVD_PORT {
            match token {
                Some(t) if tokens.verify(Purpose::Envd, id.as_str(), &t) => {}
                Some(_) => {
                    return Err(E2bError::Unauthorized(format!(
                        "the access token is not the one of sandbox {id}"
                    )))
                }
                None if self.inner.auth.enabled() => {
                    return Err(E2bError::Unauthorized(
                        "an envd access token is required: send X-Access-Token (the \
                         envdAccessToken of the sandbox)"
                            .into(),
                    ))
                }
                None => {}
            }
        }
        let caller = match self.owner(&id).await? {
            Some(t) => Caller::tenant(t, Role::User, Quotas::default()),
            None => Caller::admin(),
        };
        if port == ENVD_PORT {
            let user = route::basic_user(req.headers());
            return Ok(envd.serve(id.as_str(), caller, user, req).await);
        }
        // Another port: Warren's port proxy. Credentials meant for Warren stay here.
        for h in [
            ACCESS_TOKEN_HEADER,
            API_KEY_HEADER,
            "e2b-traffic-access-token",
        ] {
            req.headers_mut().remove(h);
        }
        // `/` is the port route itself (its `{*path}` never matches an empty rest).
        let path = match req.uri().path() {
            "/" => "",
            p => p,
        };
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        let uri: Uri = format!("/v1/sandboxes/{id}/ports/{port}{path}{query}")
            .parse()
            .map_err(|e| E2bError::BadRequest(format!("bad request path: {e}")))?;
        *req.uri_mut() = uri;
        Ok(self
            .inner
            .native
            .serve(&Principal { caller, key: None }, req)
            .await)
    }
}

#[derive(Clone)]
struct Front {
    e2b: E2b,
    app: Router,
    control: Router,
}

async fn dispatch(State(f): State<Front>, req: Request) -> Response {
    let target = route::classify(req.headers(), req.uri(), f.e2b.inner.domain.as_deref());
    match target {
        Err(e) => e.into_response(),
        Ok(route::Target::Native) => oneshot(f.app, req).await,
        Ok(route::Target::Sandbox { id, port }) => match &f.e2b.inner.place {
            Place::Local { tokens, envd } => f
                .e2b
                .local_sandbox(tokens, envd, id, port, req)
                .await
                .unwrap_or_else(IntoResponse::into_response),
            Place::Remote(owners) => {
                let mut req = req;
                route::name_in_headers(req.headers_mut(), &id, port);
                let resp = owners.forward(&id, req).await;
                if port == ENVD_PORT {
                    e2b_shaped(resp).await
                } else {
                    // The answer of a server in the sandbox: passed as it is, as the node
                    // passes it (never read whole, never rewritten).
                    resp
                }
            }
        },
        Ok(route::Target::Control) => {
            let peer = req.extensions().get::<Peer>().cloned();
            let who = match f.e2b.principal(req.headers(), peer).await {
                Ok(w) => w,
                Err(e) => return e.into_response(),
            };
            if let Place::Remote(owners) = &f.e2b.inner.place {
                if let Some(id) = route::control_sandbox(req.uri().path()) {
                    let Ok(id) = id.parse::<SandboxId>() else {
                        return E2bError::NotFound(format!("sandbox {id} not found"))
                            .into_response();
                    };
                    return e2b_shaped(owners.forward(&id, req).await).await;
                }
            }
            let mut req = req;
            req.extensions_mut().insert(who);
            oneshot(f.control, req).await
        }
    }
}

async fn oneshot(router: Router, req: Request) -> Response {
    match router.oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// Most bytes of an error answer read to put it in E2B's shape (Warren's are far smaller).
const MAX_ERROR_BODY: usize = 64 << 10;

/// A gateway's own errors (`{"error": {...}}`: node unreachable, sandbox lost, node unknown)
/// in E2B's shape; every other answer passes unchanged. At most [`MAX_ERROR_BODY`] bytes of
/// an answer are read; one that says it is longer passes unread.
async fn e2b_shaped(resp: Response) -> Response {
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    let long = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > MAX_ERROR_BODY as u64);
    if resp.status().is_success() || !json || long {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_ERROR_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return E2bError::Internal(format!(
                "the node's error answer ({}) is over {MAX_ERROR_BODY} bytes",
                parts.status
            ))
            .into_response()
        }
        Err(_) => {
            return E2bError::Internal("the node's answer was cut off".into()).into_response()
        }
    };
    let warren_shaped = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .is_some_and(|v| v.get("error").is_some_and(|e| e.is_object()));
    if warren_shaped {
        return E2bError::from_native(parts.status, &bytes).into_response();
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// Every control route E2B's SDKs call, and whether Warren offers it. `docs/e2b.md` lists
/// the same (a test keeps them together).
pub const ROUTES: &[(&str, &str, bool)] = &[
    ("POST", "/sandboxes", true),
    ("GET", "/sandboxes", true),
    ("POST", "/v2/sandboxes", true),
    ("GET", "/v2/sandboxes", true),
    ("GET", "/sandboxes/{id}", true),
    ("DELETE", "/sandboxes/{id}", true),
    ("POST", "/sandboxes/{id}/timeout", true),
    ("POST", "/sandboxes/{id}/refreshes", true),
    ("POST", "/sandboxes/{id}/pause", true),
    ("POST", "/sandboxes/{id}/resume", true),
    ("POST", "/sandboxes/{id}/connect", true),
    ("POST", "/v2/sandboxes/{id}/connect", true),
    ("POST", "/sandboxes/{id}/snapshots", true),
    ("POST", "/sandboxes/{id}/fork", true),
    ("GET", "/snapshots", true),
    ("GET", "/templates", true),
    ("DELETE", "/templates/{id}", true),
    ("GET", "/sandboxes/metrics", false),
    ("GET", "/sandboxes/{id}/metrics", false),
    ("GET", "/sandboxes/{id}/logs", false),
    ("GET", "/v2/sandboxes/{id}/logs", false),
    ("PUT", "/sandboxes/{id}/network", false),
    ("GET", "/templates/{id}", false),
    ("POST", "/v3/templates", false),
    ("GET", "/volumes", false),
    ("GET", "/secrets", false),
];

fn control_router(e2b: E2b) -> Router {
    let mut r = Router::new()
        .route("/sandboxes", post(control::create).get(list::list_v1))
        .route("/v2/sandboxes", post(control::create).get(list::list_v2))
        .route("/sandboxes/{id}", get(control::get).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/snapshots", post(control::snapshot))
        .route("/sandboxes/{id}/fork", post(control::fork))
        .route("/snapshots", get(control::snapshots))
        .route("/templates", get(control::templates))
        .route(
            "/templates/{id}",
            delete(control::delete_template).get(control::unsupported),
        );
    for (_, path, supported) in ROUTES {
        if !supported && *path != "/templates/{id}" {
            r = r.route(path, any(control::unsupported));
        }
    }
    // Everything else of E2B's API that Warren does not offer, by prefix.
    for prefix in [
        "/v2/templates",
        "/v2/templates/{*rest}",
        "/v3/templates/{*rest}",
        "/templates/{id}/{*rest}",
        "/volumes/{*rest}",
        "/secrets/{*rest}",
        "/teams",
        "/teams/{*rest}",
    ] {
        r = r.route(prefix, any(control::unsupported));
    }
    r.fallback(control::no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(warren_edge::request_id::tag))
        .with_state(e2b)
}

async fn wrong_method(req: Request) -> Response {
    let body = wire::Error {
        code: StatusCode::METHOD_NOT_ALLOWED.as_u16(),
        message: format!(
            "method {} is not allowed on {}",
            req.method(),
            req.uri().path()
        ),
    };
    (StatusCode::METHOD_NOT_ALLOWED, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests;
