//! Streamed response bodies: raw file bytes ([`ByteStream`]) and streamed exec events
//! ([`ExecStream`], newline-delimited JSON).
//!
//! Each stream holds its connection slot until it is dropped or ends, so a caller that keeps
//! many streams open uses that many of the client's connections.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{BoxStream, Stream, StreamExt};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::OwnedSemaphorePermit;
use warren_types::{ExecEvent, ExecResult};

use crate::error::ClientError;

/// The longest single NDJSON line accepted (one output chunk or the final result).
pub const MAX_EVENT_LINE: usize = 256 << 20;

/// A response body as a stream of byte chunks. Nothing is buffered beyond one chunk.
pub struct ByteStream {
    inner: BoxStream<'static, Result<Bytes, ClientError>>,
    content_length: Option<u64>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl std::fmt::Debug for ByteStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteStream")
            .field("content_length", &self.content_length)
            .finish()
    }
}

impl ByteStream {
    pub(crate) fn new(
        body: Incoming,
        content_length: Option<u64>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Self {
        let inner = body
            .into_data_stream()
            .map(|r| r.map_err(|e| ClientError::transport("reading the response body", e)))
            .boxed();
        ByteStream {
            inner,
            content_length,
            _permit: permit,
        }
    }

    /// The `Content-Length` the daemon announced, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// Collects the whole body in memory. Use only for small files.
    pub async fn collect_bytes(mut self) -> Result<Bytes, ClientError> {
        let mut buf = BytesMut::new();
        while let Some(chunk) = self.next().await {
            buf.extend_from_slice(&chunk?);
        }
        Ok(buf.freeze())
    }

    /// The body as an [`tokio::io::AsyncRead`].
    pub fn into_async_read(self) -> impl tokio::io::AsyncRead + Send + Unpin {
        tokio_util::io::StreamReader::new(self.map(|r| r.map_err(std::io::Error::other)))
    }
}

impl Stream for ByteStream {
    type Item = Result<Bytes, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The events of a streamed exec, in order: output chunks, then one `Exit` or `Error`.
pub struct ExecStream {
    inner: BoxStream<'static, Result<ExecEvent, ClientError>>,
}

impl std::fmt::Debug for ExecStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStream").finish_non_exhaustive()
    }
}

impl ExecStream {
    pub(crate) fn new(body: ByteStream) -> Self {
        ExecStream {
            inner: ndjson(body).boxed(),
        }
    }

    /// Reads events to the end, handing each output event to `on_output`, and returns the
    /// final result. An `Error` event becomes [`ClientError::Api`] (status 0: the HTTP status
    /// was already 200 when the error happened); a stream without a last event is a
    /// [`ClientError::Protocol`] error.
    pub async fn finish(
        mut self,
        mut on_output: impl FnMut(&ExecEvent),
    ) -> Result<ExecResult, ClientError> {
        while let Some(ev) = self.next().await {
            match ev? {
                ExecEvent::Exit { result } => return Ok(result),
                ExecEvent::Error { error } => return Err(ClientError::Api { status: 0, error }),
                out => on_output(&out),
            }
        }
        Err(ClientError::Protocol(
            "exec stream ended without an exit event".into(),
        ))
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// Splits a byte stream into lines and decodes each non-empty line as JSON.
pub(crate) fn ndjson<T, S>(body: S) -> impl Stream<Item = Result<T, ClientError>> + Send
where
    T: serde::de::DeserializeOwned + Send + 'static,
    S: Stream<Item = Result<Bytes, ClientError>> + Send + Unpin + 'static,
{
    struct State<S> {
        body: S,
        buf: BytesMut,
        /// Bytes of `buf` already searched for a newline.
        scanned: usize,
        done: bool,
    }
    let state = State {
        body,
        buf: BytesMut::new(),
        scanned: 0,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(pos) = st.buf[st.scanned..].iter().position(|&b| b == b'\n') {
                let line = st.buf.split_to(st.scanned + pos + 1);
                st.scanned = 0;
                let line = trim_line(&line);
                if line.is_empty() {
                    continue;
                }
                let item = serde_json::from_slice::<T>(line)
                    .map_err(|e| ClientError::decode("an NDJSON event", e));
                return Some((item, st));
            }
            st.scanned = st.buf.len();
            if st.done {
                if st.buf.is_empty() {
                    return None;
                }
                let rest = st.buf.split();
                st.scanned = 0;
                let line = trim_line(&rest);
                if line.is_empty() {
                    return None;
                }
                let item = serde_json::from_slice::<T>(line)
                    .map_err(|e| ClientError::decode("the last NDJSON event", e));
                return Some((item, st));
            }
            match st.body.next().await {
                Some(Ok(chunk)) => {
                    if st.buf.len() + chunk.remaining() > MAX_EVENT_LINE {
                        st.done = true;
                        st.buf.clear();
                        st.scanned = 0;
                        let msg = format!("an NDJSON line is longer than {MAX_EVENT_LINE} bytes");
                        return Some((Err(ClientError::Protocol(msg)), st));
                    }
                    st.buf.extend_from_slice(&chunk);
                }
                Some(Err(e)) => {
                    st.done = true;
                    st.buf.clear();
                    st.scanned = 0;
                    return Some((Err(e), st));
                }
                None => st.done = true,
            }
        }
    })
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut l = line;
    while let [rest @ .., b'\n' | b'\r' | b' ' | b'\t'] = l {
        l = rest;
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn decode(chunks: &[&str]) -> Vec<Result<ExecEvent, String>> {
        let chunks: Vec<Result<Bytes, ClientError>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c.as_bytes())))
            .collect();
        let s = futures::stream::iter(chunks);
        ndjson::<ExecEvent, _>(s)
            .map(|r| r.map_err(|e| e.to_string()))
            .collect()
            .await
    }

    #[tokio::test]
    async fn lines_split_anywhere_decode() {
        let evs = decode(&[
            "{\"type\":\"stdout\",\"da",
            "ta\":\"a\"}\n\n{\"type\":\"stderr\",\"data\":\"b\"}\r\n{\"type\":\"stdout\",",
            "\"data\":\"c\"}",
        ])
        .await;
        assert_eq!(
            evs,
            vec![
                Ok(ExecEvent::Stdout { data: "a".into() }),
                Ok(ExecEvent::Stderr { data: "b".into() }),
                Ok(ExecEvent::Stdout { data: "c".into() }),
            ]
        );
    }

    #[tokio::test]
    async fn bad_lines_are_errors() {
        let evs = decode(&["{\"type\":\"nope\"}\n"]).await;
        assert_eq!(evs.len(), 1);
        assert!(evs[0].is_err());
        assert!(decode(&["", "\n", "  \n"]).await.is_empty());
    }
}
