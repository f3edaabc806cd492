//! A client with several URLs against real HTTP servers on loopback that refuse connections,
//! break them, answer `503`/`429` with `Retry-After`, or serve: which calls move on to the
//! next URL, which wait and how often, and which come back at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use warren_client::{
    Client, ClientError, CreateSandboxRequest, ExecRequest, ExecResult, Limits, SandboxInfo,
    SandboxState,
};

/// How a test server answers every call.
#[derive(Clone, Copy)]
enum Mode {
    /// 200 with a plausible body.
    Serve,
    /// `503` with `Retry-After` and the given error code.
    Unavailable(&'static str, u64),
    /// `429 busy` with `Retry-After` for the first `n` calls, then serves.
    BusyFor(usize, u64),
}

struct Server {
    url: String,
    hits: Arc<AtomicUsize>,
    times: Arc<Mutex<Vec<Instant>>>,
}

impl Server {
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct St {
    mode: Mode,
    name: &'static str,
    hits: Arc<AtomicUsize>,
    times: Arc<Mutex<Vec<Instant>>>,
}

fn error(status: u16, code: &str, retry_after: u64) -> Response {
    let mut h = HeaderMap::new();
    h.insert("retry-after", retry_after.to_string().parse().unwrap());
    let body =
        serde_json::json!({"error": {"code": code, "message": "test", "retry_after": retry_after}});
    (StatusCode::from_u16(status).unwrap(), h, Json(body)).into_response()
}

async fn answer(st: &St, ok: serde_json::Value) -> Response {
    let n = st.hits.fetch_add(1, Ordering::SeqCst);
    st.times.lock().unwrap().push(Instant::now());
    match st.mode {
        Mode::Serve => Json(ok).into_response(),
        Mode::Unavailable(code, secs) => error(503, code, secs),
        Mode::BusyFor(k, secs) if n < k => error(429, "busy", secs),
        Mode::BusyFor(..) => Json(ok).into_response(),
    }
}

async fn health(State(st): State<St>) -> Response {
    let body = serde_json::json!({"status": "ok", "node": st.name, "version": "t", "substrates": ["container"]});
    answer(&st, body).await
}

async fn create(State(st): State<St>, Json(req): Json<CreateSandboxRequest>) -> Response {
    let info = SandboxInfo {
        id: format!("{}-01J", st.name),
        substrate: req.substrate,
        state: SandboxState::Running,
        image: req.image.refs(),
        limits: Limits::default(),
        labels: req.labels.clone(),
        env: req.env.clone(),
        workdir: None,
        user: None,
        network: Default::default(),
        created_at_ms: 1,
        expires_at_ms: None,
        idle_timeout_secs: None,
        last_activity_ms: 1,
        reason: None,
        idempotency_key: req.idempotency_key.clone(),
        tenant: None,
        pty: false,
    };
    answer(&st, serde_json::to_value(info).unwrap()).await
}

async fn exec(State(st): State<St>) -> Response {
    let r = ExecResult {
        exit_code: Some(0),
        stdout: st.name.to_string(),
        ..Default::default()
    };
    answer(&st, serde_json::to_value(r).unwrap()).await
}

async fn serve(name: &'static str, mode: Mode) -> Server {
    let hits = Arc::new(AtomicUsize::new(0));
    let times = Arc::new(Mutex::new(Vec::new()));
    let st = St {
        mode,
        name,
        hits: hits.clone(),
        times: times.clone(),
    };
    let app = Router::new()
        .route("/v1/health", get(health))
        .route("/v1/sandboxes", post(create))
        .route("/v1/sandboxes/{id}/exec", post(exec))
        .with_state(st);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server {
        url: format!("http://{addr}"),
        hits,
        times,
    }
}

/// A loopback port nobody listens on: connections are refused.
async fn refused() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

/// A server that accepts each connection, reads the request and closes without answering.
async fn breaker() -> (String, Arc<AtomicUsize>) {
    use tokio::io::AsyncReadExt;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let count = n.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            count.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    (format!("http://{addr}"), n)
}

fn client(urls: &[&str]) -> Client {
    Client::builder().url(urls.join(",")).build().unwrap()
}

#[tokio::test]
async fn reads_pass_refused_and_unavailable_urls_then_stay_with_the_one_that_answered() {
    let dead = refused().await;
    let gone = serve("gone", Mode::Unavailable("gateway_unavailable", 1)).await;
    let good = serve("good", Mode::Serve).await;
    let c = client(&[&dead, &gone.url, &good.url]);
    assert_eq!(c.endpoints().count(), 3);

    let h = c.health().await.unwrap();
    assert_eq!(h.node, "good");
    assert_eq!((gone.hits(), good.hits()), (1, 1));
    assert_eq!(c.current_endpoint().to_string(), good.url);

    // The next calls go straight to the URL that answered.
    for _ in 0..3 {
        c.health().await.unwrap();
    }
    assert_eq!((gone.hits(), good.hits()), (1, 4));
}

#[tokio::test]
async fn a_request_that_never_left_goes_to_the_next_url_whatever_the_call() {
    let dead = refused().await;
    let good = serve("good", Mode::Serve).await;
    let c = client(&[&dead, &good.url]);
    let r = c
        .exec("good-01J", &ExecRequest::shell("true"))
        .await
        .unwrap();
    assert_eq!(r.stdout, "good");
    assert_eq!(good.hits(), 1);
}

#[tokio::test]
async fn calls_that_are_not_safe_to_repeat_are_not_repeated_once_sent() {
    let gone = serve("gone", Mode::Unavailable("gateway_unavailable", 1)).await;
    let good = serve("good", Mode::Serve).await;
    let c = client(&[&gone.url, &good.url]);
    let e = c
        .exec("x-01J", &ExecRequest::shell("true"))
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(503));
    // A create without an idempotency key is not repeated either.
    let e = c
        .create(&CreateSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert_eq!((gone.hits(), good.hits()), (2, 0));

    // A connection that broke after the request left: not repeated.
    let (broken, broken_hits) = breaker().await;
    let c = client(&[&broken, &good.url]);
    let e = c
        .exec("x-01J", &ExecRequest::shell("true"))
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Transport { .. }), "{e:?}");
    assert_eq!((broken_hits.load(Ordering::SeqCst), good.hits()), (1, 0));
}

#[tokio::test]
async fn safe_calls_move_on_after_a_broken_connection_or_a_503() {
    let (broken, broken_hits) = breaker().await;
    let gone = serve("gone", Mode::Unavailable("capacity_unavailable", 1)).await;
    let good = serve("good", Mode::Serve).await;
    let c = client(&[&broken, &gone.url, &good.url]);
    assert_eq!(c.health().await.unwrap().node, "good");
    assert_eq!(broken_hits.load(Ordering::SeqCst), 1);

    // A create carrying an idempotency key is safe to repeat.
    let c = client(&[&gone.url, &good.url]);
    let req = CreateSandboxRequest {
        idempotency_key: Some("k-1".into()),
        ..Default::default()
    };
    assert_eq!(c.create(&req).await.unwrap().id, "good-01J");
    assert_eq!((gone.hits(), good.hits()), (2, 2));
}

#[tokio::test]
async fn a_dead_node_behind_a_gateway_is_reported_at_once() {
    let gw1 = serve("gw1", Mode::Unavailable("node_unreachable", 1)).await;
    let gw2 = serve("gw2", Mode::Serve).await;
    let c = client(&[&gw1.url, &gw2.url]);
    let e = c.health().await.unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert_eq!((gw1.hits(), gw2.hits()), (1, 0));
}

#[tokio::test]
async fn retry_after_is_waited_for_on_429_then_the_call_succeeds() {
    let busy = serve("busy", Mode::BusyFor(2, 1)).await;
    let c = client(&[&busy.url]);
    assert_eq!(c.health().await.unwrap().node, "busy");
    assert_eq!(busy.hits(), 3);
    let times = busy.times.lock().unwrap().clone();
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= Duration::from_secs(1),
            "the client came back before Retry-After: {:?}",
            pair[1] - pair[0]
        );
    }
}

#[tokio::test]
async fn waiting_is_bounded() {
    let busy = serve("busy", Mode::BusyFor(usize::MAX, 0)).await;
    let c = Client::builder()
        .url(busy.url.clone())
        .max_retries(3)
        .build()
        .unwrap();
    let e = c.health().await.unwrap_err();
    assert_eq!(e.status(), Some(429));
    assert_eq!(busy.hits(), 4, "one call and three retries");

    // Unavailable everywhere: each round visits both URLs, then waits.
    let a = serve("a", Mode::Unavailable("capacity_unavailable", 0)).await;
    let b = serve("b", Mode::Unavailable("capacity_unavailable", 0)).await;
    let c = Client::builder()
        .url(format!("{},{}", a.url, b.url))
        .max_retries(2)
        .build()
        .unwrap();
    let e = c.health().await.unwrap_err();
    assert_eq!(e.status(), Some(503));
    assert_eq!((a.hits(), b.hits()), (3, 3));
}

#[tokio::test]
async fn every_url_refusing_names_the_last_one() {
    let a = refused().await;
    let b = refused().await;
    let c = client(&[&a, &b]);
    let e = c
        .exec("x-01J", &ExecRequest::shell("true"))
        .await
        .unwrap_err();
    let ClientError::Transport { context, .. } = &e else {
        panic!("expected a transport error, got {e:?}")
    };
    assert!(context.contains(&b[7..]), "{context}");
}

#[test]
fn url_lists_are_parsed() {
    let c = Client::builder()
        .url("http://127.0.0.1:1, unix:///tmp/w.sock")
        .build()
        .unwrap();
    let urls: Vec<String> = c.endpoints().map(|e| e.to_string()).collect();
    assert_eq!(urls, ["http://127.0.0.1:1", "unix:///tmp/w.sock"]);
    assert!(Client::builder()
        .url("http://127.0.0.1:1,,http://127.0.0.1:2")
        .build()
        .is_err());
}
