//! A small blob server: serves a [`LocalStore`](crate::LocalStore) directory over HTTP with
//! `Range` support, an optional bandwidth cap shared by all connections, and counters. Used by
//! tests and by `warren bench images` (as a separate process) to stand in for a registry.

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// Counters of a [`serve`]d directory.
#[derive(Debug, Default)]
pub struct ServeStats {
    pub requests: AtomicU64,
    pub range_requests: AtomicU64,
    pub bytes: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    root: PathBuf,
    /// Bytes per second; 0 = unlimited.
    rate: u64,
    next_free: tokio::sync::Mutex<Instant>,
    stats: Arc<ServeStats>,
}

impl Shared {
    /// Waits until `n` more bytes may be sent under the cap.
    async fn throttle(&self, n: usize) {
        if self.rate == 0 {
            return;
        }
        let at = {
            let mut next = self.next_free.lock().await;
            let start = (*next).max(Instant::now());
            *next = start + Duration::from_secs_f64(n as f64 / self.rate as f64);
            start
        };
        tokio::time::sleep_until(at.into()).await;
    }
}

fn parse_range(h: &HeaderMap, size: u64) -> Option<Result<(u64, u64), ()>> {
    let v = h.get(header::RANGE)?.to_str().ok()?;
    let spec = v.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let a: u64 = a.parse().ok()?;
    let b: u64 = if b.is_empty() {
        size.saturating_sub(1)
    } else {
        b.parse().ok()?
    };
    if a >= size || b < a {
        return Some(Err(()));
    }
    Some(Ok((a, b.min(size - 1))))
}

async fn get(
    State(s): State<Arc<Shared>>,
    method: Method,
    UrlPath(key): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    s.stats.requests.fetch_add(1, Ordering::Relaxed);
    let status = |c: StatusCode| {
        Response::builder()
            .status(c)
            .body(Body::empty())
            .expect("valid response")
    };
    if key
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return status(StatusCode::BAD_REQUEST);
    }
    let path = s.root.join(&key);
    let Ok(mut f) = tokio::fs::File::open(&path).await else {
        return status(StatusCode::NOT_FOUND);
    };
    let size = match f.metadata().await {
        Ok(m) if m.is_file() => m.len(),
        _ => return status(StatusCode::NOT_FOUND),
    };
    let (code, a, b) = match parse_range(&headers, size) {
        None => (StatusCode::OK, 0, size),
        Some(Ok((a, b))) => {
            s.stats.range_requests.fetch_add(1, Ordering::Relaxed);
            (StatusCode::PARTIAL_CONTENT, a, b + 1)
        }
        Some(Err(())) => return status(StatusCode::RANGE_NOT_SATISFIABLE),
    };
    let mut resp = Response::builder()
        .status(code)
        .header(header::CONTENT_LENGTH, b - a)
        .header(header::ACCEPT_RANGES, "bytes");
    if code == StatusCode::PARTIAL_CONTENT {
        resp = resp.header(header::CONTENT_RANGE, format!("bytes {a}-{}/{size}", b - 1));
    }
    if method == Method::HEAD {
        return resp.body(Body::empty()).expect("valid response");
    }
    if f.seek(std::io::SeekFrom::Start(a)).await.is_err() {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    }
    let shared = s.clone();
    let stream = futures::stream::unfold((f, b - a), move |(mut f, left)| {
        let shared = shared.clone();
        async move {
            if left == 0 {
                return None;
            }
            let mut buf = vec![0u8; left.min(64 * 1024) as usize];
            match f.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    shared.throttle(n).await;
                    shared.stats.bytes.fetch_add(n as u64, Ordering::Relaxed);
                    Some((
                        Ok::<Bytes, std::io::Error>(Bytes::from(buf)),
                        (f, left - n as u64),
                    ))
                }
                Err(e) => Some((Err(e), (f, 0))),
            }
        }
    });
    resp.body(Body::from_stream(stream))
        .expect("valid response")
}

/// Serves `root` on `listener` until the task is dropped. `rate` caps bytes/s (0 = none).
pub async fn serve(
    listener: tokio::net::TcpListener,
    root: PathBuf,
    rate: u64,
    stats: Arc<ServeStats>,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared {
        root,
        rate,
        next_free: tokio::sync::Mutex::new(Instant::now()),
        stats,
    });
    let app = axum::Router::new()
        .route("/{*key}", axum::routing::get(get).head(get))
        .with_state(shared);
    axum::serve(listener, app).await
}
