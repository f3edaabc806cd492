//! Command routes: one-shot exec, streamed exec, and background processes.

use std::time::Duration;

use hyper::Method;
use serde::{Deserialize, Serialize};
use warren_types::{ExecRequest, ExecResult, ProcessInfo};

use crate::client::{runs_for_secs, seg, Client};
use crate::error::ClientError;
use crate::failover::Retry;
use crate::stream::ExecStream;

#[derive(Deserialize)]
struct ProcessList {
    processes: Vec<ProcessInfo>,
}

#[derive(Serialize)]
struct KillBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<i32>,
}

impl Client {
    /// `POST /v1/sandboxes/{id}/exec`: runs a command to completion and returns its
    /// captured output. A `timeout_secs` longer than the client's request timeout is waited
    /// for: the answer comes when the command ends.
    pub async fn exec(&self, id: &str, req: &ExecRequest) -> Result<ExecResult, ClientError> {
        let path = format!("/v1/sandboxes/{}/exec", seg(id));
        let retry = Retry::for_method(&Method::POST);
        self.call_json_as(
            retry,
            Method::POST,
            &path,
            Some(req),
            "the exec result",
            runs_for_secs(req.timeout_secs),
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/exec/stream`: runs a command and streams its output as it
    /// comes. The last event is `Exit` (or `Error`); see [`ExecStream::finish`].
    pub async fn exec_stream(
        &self,
        id: &str,
        req: &ExecRequest,
    ) -> Result<ExecStream, ClientError> {
        let path = format!("/v1/sandboxes/{}/exec/stream", seg(id));
        let body = serde_json::to_vec(req).map_err(|e| ClientError::Encode {
            what: "the exec request".into(),
            source: e,
        })?;
        let reply = self
            .send(
                Method::POST,
                &path,
                crate::client::full_body(body.into()),
                Some(crate::client::JSON),
            )
            .await?;
        Ok(ExecStream::new(reply.into_stream()))
    }

    /// `POST /v1/sandboxes/{id}/exec/attach`: runs a command with `stdin` streamed to it (any
    /// bytes, any size; its end closes the command's stdin) while its output streams back.
    /// `req.stdin` and `req.step` must be unset.
    pub async fn exec_attach<R>(
        &self,
        id: &str,
        req: &ExecRequest,
        stdin: R,
    ) -> Result<ExecStream, ClientError>
    where
        R: tokio::io::AsyncRead + Send + 'static,
    {
        use futures::{StreamExt, TryStreamExt};
        use http_body_util::{BodyExt, StreamBody};
        let path = format!("/v1/sandboxes/{}/exec/attach", seg(id));
        let mut head = serde_json::to_vec(req).map_err(|e| ClientError::Encode {
            what: "the exec request".into(),
            source: e,
        })?;
        head.push(b'\n');
        // Small chunks: what arrives on stdin goes on at once (interactive use).
        let rest = tokio_util::io::ReaderStream::with_capacity(stdin, 64 << 10);
        let frames = futures::stream::once(async move { Ok(bytes::Bytes::from(head)) })
            .chain(rest)
            .map_ok(hyper::body::Frame::data);
        let body: crate::client::Body = StreamBody::new(frames).boxed_unsync();
        let reply = self
            .send(
                Method::POST,
                &path,
                crate::client::Payload::stream(body),
                Some(crate::client::OCTET_STREAM),
            )
            .await?;
        Ok(ExecStream::new(reply.into_stream()))
    }

    /// `POST /v1/sandboxes/{id}/processes`: starts a background process. Its output is kept
    /// (up to the request's cap) until it is waited for.
    pub async fn spawn(&self, id: &str, req: &ExecRequest) -> Result<ProcessInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/processes", seg(id));
        self.call_json(Method::POST, &path, Some(req), "the new process")
            .await
    }

    /// `GET /v1/sandboxes/{id}/processes`.
    pub async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>, ClientError> {
        let path = format!("/v1/sandboxes/{}/processes", seg(id));
        let list: ProcessList = self
            .call_json(Method::GET, &path, None::<&()>, "the process list")
            .await?;
        Ok(list.processes)
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}`.
    pub async fn get_process(&self, id: &str, pid: u32) -> Result<ProcessInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/processes/{pid}", seg(id));
        self.call_json(Method::GET, &path, None::<&()>, "the process")
            .await
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/wait`: waits for the process to exit and
    /// returns its result. With a `timeout` that passes first, the daemon answers
    /// `timeout` (see [`ClientError::code`]) and the process keeps running.
    pub async fn wait_process(
        &self,
        id: &str,
        pid: u32,
        timeout: Option<Duration>,
    ) -> Result<ExecResult, ClientError> {
        let mut path = format!("/v1/sandboxes/{}/processes/{pid}/wait", seg(id));
        if let Some(t) = timeout {
            path.push_str(&format!("?timeout_secs={}", t.as_secs_f64()));
        }
        self.call_json_as(
            Retry::for_method(&Method::POST),
            Method::POST,
            &path,
            None::<&()>,
            "the process result",
            timeout,
        )
        .await
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/kill`: sends `signal` (default 9, SIGKILL).
    pub async fn kill_process(
        &self,
        id: &str,
        pid: u32,
        signal: Option<i32>,
    ) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{}/processes/{pid}/kill", seg(id));
        self.call_empty(Method::POST, &path, Some(&KillBody { signal }))
            .await
    }
}
