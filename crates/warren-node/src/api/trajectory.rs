//! `GET /v1/sandboxes/{id}/trajectory?from_seq=N`: the sandbox's trajectory as
//! newline-delimited JSON, one entry per line, streamed page by page.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::error::HttpResult;
use super::extract::{QueryPairs, SandboxParam};
use crate::manager::Manager;

pub async fn export(
    State(m): State<Manager>,
    SandboxParam(id): SandboxParam,
    q: QueryPairs,
) -> HttpResult<Response> {
    q.only(&["from_seq"], &[])?;
    let from = q.index("from_seq", "a sequence number")?.unwrap_or(1);
    let pages = m.trajectory(&id, from)?;
    let lines = futures::stream::unfold(pages, |mut pages| async move {
        match pages.next_page().await? {
            Ok(entries) => {
                let mut out = Vec::new();
                for e in &entries {
                    // Entries are plain data; encoding them cannot fail.
                    if serde_json::to_writer(&mut out, e).is_ok() {
                        out.push(b'\n');
                    }
                }
                Some((Ok(Bytes::from(out)), pages))
            }
            // An error after the first line can only abort the transfer.
            Err(e) => Some((Err(std::io::Error::other(e.to_string())), pages)),
        }
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}
