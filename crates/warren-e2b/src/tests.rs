//! The dispatch and authentication of the front, over a stand-in for the v1 router (the
//! end-to-end tests with E2B's SDKs run a real node: sdk/python/tests/e2b).

use super::*;
use axum::routing::get;
use axum::Json;
use warren_edge::{token_sha256, AuthFile};

fn auth(on: bool) -> Arc<Authenticator> {
    if !on {
        return Arc::new(Authenticator::open());
    }
    let text = format!(
        "[[tenant]]\nname = \"a\"\nrole = \"user\"\ntoken_sha256 = [\"{}\"]\n",
        token_sha256("good")
    );
    Arc::new(Authenticator::from_parsed(AuthFile::parse(&text).unwrap()))
}

/// A v1 router that knows one sandbox, owned by tenant `a`, and says who called.
fn stand_in(id: &SandboxId) -> Router {
    let info = serde_json::json!({
        "id": id.as_str(), "substrate": "container", "state": "running",
        "image": ["default"],
        "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 512, "pids": 512},
        "labels": {"run": "7"}, "env": {}, "workdir": null, "user": null,
        "network": {"mode": "none"}, "created_at_ms": 1_700_000_000_000u64,
        "expires_at_ms": 1_700_000_300_000u64, "idle_timeout_secs": null,
        "last_activity_ms": 0, "reason": null, "idempotency_key": null, "tenant": "a"
    });
    let one = info.clone();
    let known = id.to_string();
    Router::new()
        .route(
            "/v1/sandboxes",
            get(move || {
                let info = info.clone();
                async move { Json(serde_json::json!({ "sandboxes": [info] })) }
            }),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(move |axum::extract::Path(id): axum::extract::Path<String>| {
                let (one, known) = (one.clone(), known.clone());
                async move {
                    if id == known {
                        Json(one).into_response()
                    } else {
                        (
                            StatusCode::NOT_FOUND,
                            Json(serde_json::json!({"error": {"code": "sandbox_not_found", "message": format!("sandbox {id} not found")}})),
                        )
                            .into_response()
                    }
                }
            }),
        )
        // A route a decoded `/` in an E2B path could reach: it answers a file, not a record.
        .route(
            "/v1/sandboxes/{id}/files",
            get(|| async { "root:x:0:0:root:/root:/bin/sh\n" }),
        )
        .route("/v1/sandboxes/{id}/ports/{port}/{*rest}", get(port_echo))
        .route("/v1/sandboxes/{id}/ports/{port}", get(port_echo))
}

async fn port_echo(req: Request) -> String {
    let who = req.extensions().get::<Caller>().cloned().unwrap();
    format!(
        "{} as {} token={:?}",
        req.uri(),
        who.name(),
        req.headers().get(ACCESS_TOKEN_HEADER)
    )
}

fn front(on: bool, id: &SandboxId) -> (E2b, Router) {
    let e2b = E2b::node(
        stand_in(id),
        auth(on),
        Tokens::from_secret([1; 32]),
        Some("sb.example".into()),
    );
    let app = Router::new().route("/v1/health", get(|| async { "warren" }));
    let wrapped = e2b.wrap(app);
    (e2b, wrapped)
}

async fn send(app: &Router, req: Request) -> (StatusCode, String) {
    let r = oneshot(app.clone(), req).await;
    let s = r.status();
    let b = r.into_body().collect().await.unwrap().to_bytes();
    (s, String::from_utf8_lossy(&b).into_owned())
}

fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Body::empty()).unwrap()
}

fn sandbox() -> SandboxId {
    SandboxId::generate(&"n1".parse().unwrap())
}

#[tokio::test]
async fn warren_routes_pass_unchanged() {
    let (_, app) = front(true, &sandbox());
    assert_eq!(
        send(&app, req("GET", "/v1/health", &[])).await,
        (StatusCode::OK, "warren".into())
    );
}

#[tokio::test]
async fn api_keys_are_warren_tokens() {
    let id = sandbox();
    let (_, app) = front(true, &id);
    let (s, b) = send(&app, req("GET", "/v2/sandboxes", &[])).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["code"], 401);
    let (s, _) = send(&app, req("GET", "/v2/sandboxes", &[("X-API-Key", "bad")])).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let (s, b) = send(
        &app,
        req(
            "GET",
            "/v2/sandboxes?metadata=run%3D7",
            &[("X-API-Key", "good")],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v[0]["sandboxID"], id.as_str());
    assert_eq!(v[0]["templateID"], "base");
    assert_eq!(v[0]["metadata"]["run"], "7");
    // Without --auth any key, or none, is the administrator.
    let (_, open) = front(false, &id);
    let (s, _) = send(&open, req("GET", "/v2/sandboxes", &[])).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn a_detail_carries_the_sandboxs_own_token() {
    let id = sandbox();
    let (e2b, app) = front(true, &id);
    let (s, b) = send(
        &app,
        req("GET", &format!("/sandboxes/{id}"), &[("X-API-Key", "good")]),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    let token = v["envdAccessToken"].as_str().unwrap();
    assert_eq!(
        Some(token.to_string()),
        e2b.extras(id.as_str()).envd_access_token
    );
    assert_eq!(v["domain"], "sb.example");
    assert_eq!(v["state"], "running");
    let other = sandbox();
    let (s, b) = send(
        &app,
        req(
            "GET",
            &format!("/sandboxes/{other}"),
            &[("X-API-Key", "good")],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    assert!(b.contains("\"code\":404"), "{b}");
}

#[tokio::test]
async fn envd_requests_need_the_sandboxs_token_under_auth() {
    let id = sandbox();
    let (e2b, app) = front(true, &id);
    let sid = ("E2b-Sandbox-Id", id.as_str());
    let (s, _) = send(&app, req("GET", "/health", &[sid])).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let wrong = e2b.extras(sandbox().as_str()).envd_access_token.unwrap();
    let (s, _) = send(
        &app,
        req("GET", "/health", &[sid, ("X-Access-Token", &wrong)]),
    )
    .await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let right = e2b.extras(id.as_str()).envd_access_token.unwrap();
    let (s, _) = send(
        &app,
        req("GET", "/health", &[sid, ("X-Access-Token", &right)]),
    )
    .await;
    assert_ne!(s, StatusCode::UNAUTHORIZED);
    // An unknown sandbox is E2B's 404.
    let other = sandbox();
    let t = e2b.extras(other.as_str()).envd_access_token.unwrap();
    let (s, b) = send(
        &app,
        req(
            "GET",
            "/health",
            &[("E2b-Sandbox-Id", other.as_str()), ("X-Access-Token", &t)],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
}

#[tokio::test]
async fn other_ports_go_to_the_port_proxy_as_the_owner() {
    let id = sandbox();
    let (_, app) = front(true, &id);
    let host = format!("8000-{id}.sb.example");
    let (s, b) = send(
        &app,
        req(
            "GET",
            "/a/b?c=d",
            &[("Host", &host), ("X-Access-Token", "x")],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(
        b,
        format!("/v1/sandboxes/{id}/ports/8000/a/b?c=d as a token=None")
    );
    let (s, b) = send(
        &app,
        req(
            "GET",
            "/",
            &[
                ("E2b-Sandbox-Id", id.as_str()),
                ("E2b-Sandbox-Port", "3000"),
            ],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(
        b.starts_with(&format!("/v1/sandboxes/{id}/ports/3000 as a")),
        "{b}"
    );
}

#[tokio::test]
async fn unknown_and_refused_routes_answer_in_e2bs_shape() {
    let (_, app) = front(false, &sandbox());
    let (s, b) = send(&app, req("GET", "/volumes", &[])).await;
    assert_eq!(s, StatusCode::NOT_IMPLEMENTED, "{b}");
    assert!(b.contains("\"code\":501"));
    let (s, _) = send(&app, req("GET", "/no/such/thing", &[])).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, b) = send(&app, req("PATCH", "/sandboxes", &[])).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED, "{b}");
    let (s, b) = send(&app, req("POST", "/v2/sandboxes", &[])).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
}

#[tokio::test]
async fn sandbox_ids_in_paths_are_ids_not_routes() {
    let id = sandbox();
    let (_, app) = front(false, &id);
    let json = |b: &str| serde_json::from_str::<serde_json::Value>(b).unwrap();
    // A decoded `/` and `?` must not splice another v1 route into the call.
    let spliced = format!("{id}%2Ffiles%3Fpath%3D%2Fetc%2Fpasswd");
    for (method, path) in [
        ("GET", format!("/sandboxes/{spliced}")),
        ("DELETE", format!("/sandboxes/{spliced}")),
        ("POST", format!("/sandboxes/{spliced}/pause")),
        ("POST", format!("/v2/sandboxes/{spliced}/connect")),
        ("GET", "/sandboxes/..%2F..%2Fv1%2Fimages".to_string()),
    ] {
        let (s, b) = send(&app, req(method, &path, &[])).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}: {b}");
        assert_eq!(json(&b)["code"], 404, "{b}");
    }
    // Not UTF-8: E2B's 400, not axum's plain text.
    let (s, b) = send(&app, req("GET", "/sandboxes/%FF%FE", &[])).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(json(&b)["code"], 400, "{b}");
    let (s, b) = send(&app, req("DELETE", "/templates/%FF", &[])).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert_eq!(json(&b)["code"], 400, "{b}");
    // The real id still works.
    let (s, b) = send(&app, req("GET", &format!("/sandboxes/{id}"), &[])).await;
    assert_eq!(s, StatusCode::OK, "{b}");
}

#[tokio::test]
async fn oversized_bodies_are_e2bs_413() {
    let id = sandbox();
    let (_, app) = front(false, &id);
    for n in [(1 << 20) + 1, 3 << 20] {
        let mut body = br#"{"templateID": "base", "metadata": {"x": ""#.to_vec();
        body.resize(n, b'a');
        let r = Request::builder()
            .method("POST")
            .uri("/v2/sandboxes")
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap();
        let (s, b) = send(&app, r).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{n}: {b}");
        let v: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["code"], 413, "{b}");
    }
}

/// A gateway's hop to a node: the headers go as the gateway's proxy sends them (no `Host`).
struct Hop(Router);

impl Owners for Hop {
    fn forward(&self, _: &SandboxId, mut req: Request) -> BoxFuture<'static, Response> {
        req.headers_mut().remove(header::HOST);
        Box::pin(oneshot(self.0.clone(), req))
    }
}

#[tokio::test]
async fn a_gateway_forwards_host_routed_ports_to_a_node_of_any_domain() {
    let id = sandbox();
    // The node serves no domain: only the headers the gateway adds can route there.
    let node = E2b::node(
        stand_in(&id),
        auth(false),
        Tokens::from_secret([1; 32]),
        None,
    )
    .wrap(Router::new());
    let gw = E2b::gateway(
        Router::new(),
        auth(false),
        Arc::new(Hop(node)),
        Some("sb.example".into()),
    )
    .wrap(Router::new());
    let host = format!("8000-{id}.sb.example");
    let (s, b) = send(&gw, req("GET", "/index.html?x=1", &[("Host", &host)])).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(
        b.starts_with(&format!("/v1/sandboxes/{id}/ports/8000/index.html?x=1 as ")),
        "{b}"
    );
    // Header routing passes as it came.
    let (s, b) = send(
        &gw,
        req(
            "GET",
            "/",
            &[
                ("E2b-Sandbox-Id", id.as_str()),
                ("E2b-Sandbox-Port", "3000"),
            ],
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(
        b.starts_with(&format!("/v1/sandboxes/{id}/ports/3000 as ")),
        "{b}"
    );
}

/// A node behind a gateway whose answers are canned: a server in the sandbox that answers
/// its own JSON error, or an endless error answer (counting the bytes pulled from it).
struct Canned {
    pulled: Arc<std::sync::atomic::AtomicUsize>,
    endless: bool,
}

impl Owners for Canned {
    fn forward(&self, _: &SandboxId, _: Request) -> BoxFuture<'static, Response> {
        use futures::StreamExt;
        let (pulled, endless) = (self.pulled.clone(), self.endless);
        Box::pin(async move {
            let body = if endless {
                let chunk = bytes::Bytes::from(vec![b' '; 64 << 10]);
                Body::from_stream(futures::stream::iter(0..1024).map(move |_| {
                    pulled.fetch_add(chunk.len(), std::sync::atomic::Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(chunk.clone())
                }))
            } else {
                Body::from(r#"{"error": {"code": "app_error", "message": "the app's own"}}"#)
            };
            Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .header(header::CONTENT_TYPE, "application/json")
                .body(body)
                .unwrap()
        })
    }
}

#[tokio::test]
async fn a_gateway_neither_rewrites_nor_buffers_what_a_sandbox_answers() {
    let id = sandbox();
    let gw = |endless| {
        let pulled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let e2b = E2b::gateway(
            Router::new(),
            auth(false),
            Arc::new(Canned {
                pulled: pulled.clone(),
                endless,
            }),
            Some("sb.example".into()),
        );
        (e2b.wrap(Router::new()), pulled)
    };
    // A server in the sandbox answers its own JSON error: it arrives as it was sent.
    let (app, _) = gw(false);
    let host = format!("8000-{id}.sb.example");
    let (s, b) = send(&app, req("GET", "/api", &[("Host", &host)])).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        b,
        r#"{"error": {"code": "app_error", "message": "the app's own"}}"#
    );
    // An error answer of envd that never ends is not read whole.
    let (app, pulled) = gw(true);
    let (s, b) = send(
        &app,
        req("GET", "/health", &[("E2b-Sandbox-Id", id.as_str())]),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        &b[..b.len().min(200)]
    );
    let read = pulled.load(std::sync::atomic::Ordering::SeqCst);
    assert!(read <= 4 * MAX_ERROR_BODY, "{read} bytes were read");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["code"], 500, "{b}");
}

#[test]
fn the_docs_list_every_route() {
    let docs = include_str!("../../../docs/e2b.md");
    for (method, path, _) in ROUTES {
        assert!(
            docs.contains(&format!("`{method} {path}`")),
            "docs/e2b.md does not list {method} {path}"
        );
    }
}

/// A node that is gone: every forwarded call answers 503.
struct Gone;

impl Owners for Gone {
    fn forward(&self, _: &SandboxId, _: Request) -> BoxFuture<'static, Response> {
        Box::pin(async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({"error": {"code": "node_unreachable", "message": "gone"}})),
            )
                .into_response()
        })
    }
}

/// A create whose answer fails after the sandbox was made (a gateway that cannot fetch its
/// token from the node) deletes it, since the caller never learns its id; with an
/// idempotency key it stays for the retry to reach.
#[tokio::test]
async fn a_create_that_answers_an_error_leaves_no_sandbox() {
    let id = sandbox();
    let deleted = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let info = serde_json::json!({
        "id": id.as_str(), "substrate": "container", "state": "running",
        "image": ["default"],
        "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 512, "pids": 512},
        "labels": {}, "env": {}, "workdir": null, "user": null,
        "network": {"mode": "none"}, "created_at_ms": 1_700_000_000_000u64,
        "expires_at_ms": 1_700_000_300_000u64, "idle_timeout_secs": null,
        "last_activity_ms": 0, "reason": null, "idempotency_key": null, "tenant": null
    });
    let d = deleted.clone();
    let native = Router::new()
        .route(
            "/v1/sandboxes",
            axum::routing::post(move || {
                let info = info.clone();
                async move { (StatusCode::CREATED, Json(info)) }
            }),
        )
        .route(
            "/v1/sandboxes/{id}",
            axum::routing::delete(
                move |axum::extract::Path(id): axum::extract::Path<String>| {
                    let d = d.clone();
                    async move {
                        d.lock().unwrap().push(id);
                        StatusCode::NO_CONTENT
                    }
                },
            ),
        );
    let gw = E2b::gateway(native, auth(false), Arc::new(Gone), None).wrap(Router::new());
    let create = |key: Option<&str>| {
        let mut b = Request::builder()
            .method("POST")
            .uri("/sandboxes")
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(k) = key {
            b = b.header("idempotency-key", k);
        }
        b.body(Body::from(r#"{"templateID": "default"}"#)).unwrap()
    };
    let (s, b) = send(&gw, create(None)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_eq!(*deleted.lock().unwrap(), vec![id.to_string()]);
    let (s, b) = send(&gw, create(Some("k1"))).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert_eq!(
        deleted.lock().unwrap().len(),
        1,
        "a keyed create's sandbox stays"
    );
}
