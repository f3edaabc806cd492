//! A sandbox's ports: HTTP to a server listening inside a sandbox
//! (`/v1/sandboxes/{id}/ports/{port}/...`). The server's answers come back whatever their
//! status (they carry the [`PORT_HEADER`]); Warren's own refusals (no such sandbox, bad port,
//! nothing listening) are [`ClientError`]s.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{HeaderMap, Method};

use crate::client::{seg, Client};
use crate::error::ClientError;
use crate::stream::ByteStream;

/// The header the node adds to every answer of a server inside a sandbox (its value: the
/// port).
pub const PORT_HEADER: &str = "warren-port";

/// The answer of a server listening inside a sandbox.
#[derive(Debug)]
pub struct PortAnswer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: ByteStream,
}

impl Client {
    /// Sends `method path_and_query` (relative to the server's root: `/`, `/a?b=1`) with
    /// `headers` and `body` to the HTTP server listening on `port` inside sandbox `id`. Sent
    /// once (never repeated: the server may not be idempotent).
    pub async fn port_request(
        &self,
        id: &str,
        port: u16,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<PortAnswer, ClientError> {
        let rest = if path_and_query.starts_with('/') {
            path_and_query.to_string()
        } else {
            format!("/{path_and_query}")
        };
        let path = format!("/v1/sandboxes/{}/ports/{port}{rest}", seg(id));
        let body = Full::new(body)
            .map_err(|never| match never {})
            .boxed_unsync();
        let reply = self.send_raw(method, &path, headers, body).await?;
        let status = reply.response.status().as_u16();
        if status >= 400 && !reply.response.headers().contains_key(PORT_HEADER) {
            let body = Limited::new(reply.response.into_body(), 1 << 20)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            return Err(ClientError::from_response(status, &body));
        }
        let headers = reply.response.headers().clone();
        Ok(PortAnswer {
            status,
            headers,
            body: reply.into_stream(),
        })
    }
}
