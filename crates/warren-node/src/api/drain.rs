//! Refusals read what the client is still sending.
//!
//! A handler that refuses a request before reading its body (an upload announced too large,
//! a sandbox that does not exist) answers at once. If the connection were then closed with
//! the rest of the body unread, the kernel would reset it, and a client still writing would
//! see "connection reset" instead of the typed error. This layer hands the unread body back
//! to the router when the handler drops it, and after an error answer reads and discards
//! up to [`DRAIN_CAP`] bytes of it (for at most [`DRAIN_TIME`]) so the answer arrives.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::sync::oneshot;

/// The most of a refused body read before answering; past it the connection is dropped.
pub const DRAIN_CAP: u64 = 64 << 20;
/// The longest a refused body is read before answering.
pub const DRAIN_TIME: Duration = Duration::from_secs(10);

/// The middleware: see the module's documentation.
pub async fn drain_refused(req: Request, next: Next) -> Response {
    if req.body().is_end_stream() {
        return next.run(req).await;
    }
    let (back, mut returned) = oneshot::channel();
    let req = req.map(|inner| {
        Body::new(Returning {
            inner: Some(inner),
            back: Some(back),
        })
    });
    let resp = next.run(req).await;
    if resp.status().is_client_error() || resp.status().is_server_error() {
        if let Ok(body) = returned.try_recv() {
            let _ = tokio::time::timeout(DRAIN_TIME, discard(body, DRAIN_CAP)).await;
        }
    }
    resp
}

/// Reads and drops up to `cap` bytes of `body`.
async fn discard(mut body: Body, cap: u64) {
    let mut read = 0u64;
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            read += data.len() as u64;
            if read > cap {
                return;
            }
        }
    }
}

/// A request body that, dropped before its end, sends what is left back to the layer.
struct Returning {
    inner: Option<Body>,
    back: Option<oneshot::Sender<Body>>,
}

impl HttpBody for Returning {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) {
            this.inner = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), |b| b.size_hint())
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        if let (Some(body), Some(back)) = (self.inner.take(), self.back.take()) {
            if !body.is_end_stream() {
                let _ = back.send(body);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::put;
    use axum::Router;
    use tower::ServiceExt;

    fn chunked(n: usize, seen: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Body {
        let chunks = futures::stream::iter((0..n).map(move |_| {
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<_, std::io::Error>(Bytes::from(vec![0u8; 1024]))
        }));
        Body::from_stream(chunks)
    }

    async fn sent(status: StatusCode, n: usize) -> usize {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let app = Router::new()
            .route("/", put(move || async move { status }))
            .layer(axum::middleware::from_fn(drain_refused));
        let req = Request::put("/").body(chunked(n, seen.clone())).unwrap();
        let resp = app.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), status);
        seen.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_refused_body_is_read_before_the_answer() {
        assert_eq!(sent(StatusCode::PAYLOAD_TOO_LARGE, 100).await, 100);
    }

    #[tokio::test]
    async fn an_accepted_body_is_left_alone() {
        assert_eq!(sent(StatusCode::NO_CONTENT, 100).await, 0);
    }

    #[tokio::test]
    async fn a_refused_body_is_read_no_further_than_the_cap() {
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        discard(chunked(1000, seen.clone()), 10 * 1024).await;
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 11);
    }
}
