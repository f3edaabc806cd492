//! `GET /v1/events` on a gateway: the event streams of every live node (ready or draining),
//! merged into one. Each node's stream is cut into whole events (an event ends at a blank
//! line) before merging, so events of two nodes never interleave. Nodes that join later are
//! not in a stream already open: clients reconnect (the dashboard does every few minutes, and
//! on any error), as Server-Sent Events clients do. A node that fails ends only its part.

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use tracing::debug;

use crate::error::GatewayError;
use crate::Gateway;

/// Cuts a byte stream into whole Server-Sent Events (each with its closing blank line); a
/// partial event at the end of the stream is dropped.
pub fn whole_events<S, E>(body: S) -> impl Stream<Item = Bytes> + Send
where
    S: Stream<Item = Result<Bytes, E>> + Send + 'static,
{
    futures::stream::unfold(
        (Box::pin(body), Vec::<u8>::new()),
        |(mut body, mut buf)| async move {
            loop {
                if let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let rest = buf.split_off(end + 2);
                    let event = std::mem::replace(&mut buf, rest);
                    return Some((Bytes::from(event), (body, buf)));
                }
                match body.next().await {
                    Some(Ok(chunk)) => buf.extend_from_slice(&chunk),
                    Some(Err(_)) | None => return None,
                }
            }
        },
    )
}

pub async fn events(State(gw): State<Gateway>, req: Request) -> Response {
    let pq = req.uri().to_string();
    let view = gw.view().snapshot();
    let asks = view.live().map(|m| {
        let (address, id) = (m.record.address.clone(), m.record.id.clone());
        let gw = gw.clone();
        let (pq, headers) = (pq.clone(), req.headers().clone());
        async move {
            let sent = gw
                .proxy()
                .send(&address, Method::GET, &pq, &headers, Bytes::new());
            let r = tokio::time::timeout(gw.config().fanout_timeout, sent).await;
            (id, r)
        }
    });
    let mut streams = Vec::new();
    let mut refused = None;
    for (id, r) in futures::future::join_all(asks).await {
        match r {
            Ok(Ok(resp)) if resp.status() == StatusCode::OK => {
                streams.push(whole_events(resp.into_body().into_data_stream()).boxed());
            }
            // The same request refused by a node (a bad parameter, a bad token) is refused
            // by every node alike: pass the first refusal on.
            Ok(Ok(resp)) => refused = refused.or(Some(resp)),
            Ok(Err(e)) => debug!(node = %id, error = %e, "no event stream from the node"),
            Err(_) => debug!(node = %id, "the node's event stream did not start in time"),
        }
    }
    if streams.is_empty() {
        return match refused {
            Some(resp) => resp.map(Body::new),
            None => GatewayError::new(
                warren_types::ErrorCode::CapacityUnavailable,
                "no node of the cluster answered with its event stream",
            )
            .retry_after(1)
            .into_response(),
        };
    }
    let merged = futures::stream::select_all(streams).map(Ok::<_, std::convert::Infallible>);
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(merged),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streams_are_cut_into_whole_events() {
        let chunks: Vec<Result<Bytes, std::io::Error>> = vec![
            Ok(Bytes::from_static(b"event: a\ndata: 1")),
            Ok(Bytes::from_static(b"\n\nevent: b\ndata: 2\n\n:keep")),
            Ok(Bytes::from_static(b"-alive\n\nevent: c\ndata: cut")),
        ];
        let got: Vec<Bytes> = whole_events(futures::stream::iter(chunks)).collect().await;
        assert_eq!(
            got,
            vec![
                Bytes::from_static(b"event: a\ndata: 1\n\n"),
                Bytes::from_static(b"event: b\ndata: 2\n\n"),
                Bytes::from_static(b":keep-alive\n\n"),
            ]
        );
    }
}
