//! Node and sandbox lifecycle routes: health, create, get, list, delete, pause, resume, fork,
//! metrics.

use std::collections::BTreeMap;

use hyper::Method;
use serde::{Deserialize, Serialize};
use warren_types::{
    CreateSandboxRequest, ForkRequest, ForkResult, PauseStats, SandboxInfo, SandboxState,
};

use crate::client::{empty_body, enc, seg, Client};
use crate::error::ClientError;
use crate::failover::Retry;

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// `"ok"` when the node serves requests.
    pub status: String,
    #[serde(default)]
    pub node: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub substrates: Vec<String>,
    /// Fields newer daemons add.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Health {
    /// `status == "ok"`.
    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }
}

#[derive(Deserialize)]
struct SandboxList {
    sandboxes: Vec<SandboxInfo>,
}

/// The query string of a sandbox listing.
pub(crate) fn list_query(labels: &BTreeMap<String, String>, state: Option<SandboxState>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("label={}", enc(&format!("{k}={v}"))))
        .collect();
    if let Some(s) = state {
        parts.push(format!("state={}", s.as_str()));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

impl Client {
    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Health, ClientError> {
        self.call_json(Method::GET, "/v1/health", None::<&()>, "the health answer")
            .await
    }

    /// `POST /v1/sandboxes`: creates a sandbox (or returns the one created earlier with the
    /// same idempotency key).
    pub async fn create(&self, req: &CreateSandboxRequest) -> Result<SandboxInfo, ClientError> {
        // With a key, a second delivery returns the first sandbox: safe to repeat.
        let retry = if req.idempotency_key.is_some() {
            Retry::Idempotent
        } else {
            Retry::IfUnsent
        };
        self.call_json_as(
            retry,
            Method::POST,
            "/v1/sandboxes",
            Some(req),
            "the new sandbox",
            None,
        )
        .await
    }

    /// `GET /v1/sandboxes/{id}`.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}", seg(id));
        self.call_json(Method::GET, &path, None::<&()>, "the sandbox")
            .await
    }

    /// `GET /v1/sandboxes`: sandboxes carrying every label in `labels` and, when given, in
    /// `state`.
    pub async fn list(
        &self,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<Vec<SandboxInfo>, ClientError> {
        let path = format!("/v1/sandboxes{}", list_query(labels, state));
        let list: SandboxList = self
            .call_json(Method::GET, &path, None::<&()>, "the sandbox list")
            .await?;
        Ok(list.sandboxes)
    }

    /// `DELETE /v1/sandboxes/{id}`: stops the sandbox and frees everything it held.
    pub async fn delete(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/sandboxes/{}", seg(id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/pause`: freezes the sandbox and pushes its memory out of RAM.
    /// Any later call that needs the sandbox resumes it.
    pub async fn pause(&self, id: &str) -> Result<PauseStats, ClientError> {
        let path = format!("/v1/sandboxes/{}/pause", seg(id));
        self.call_json(Method::POST, &path, None::<&()>, "the pause stats")
            .await
    }

    /// `POST /v1/sandboxes/{id}/resume`.
    pub async fn resume(&self, id: &str) -> Result<SandboxInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/resume", seg(id));
        self.call_json(Method::POST, &path, None::<&()>, "the sandbox")
            .await
    }

    /// `POST /v1/sandboxes/{id}/fork`: `req.n` new sandboxes with a copy of this one's files.
    pub async fn fork(&self, id: &str, req: &ForkRequest) -> Result<Vec<SandboxInfo>, ClientError> {
        let path = format!("/v1/sandboxes/{}/fork", seg(id));
        let r: ForkResult = self
            .call_json(Method::POST, &path, Some(req), "the forked sandboxes")
            .await?;
        Ok(r.sandboxes)
    }

    /// `POST /v1/sandboxes/{id}/snapshot`: saves the sandbox (a VM's memory and processes
    /// too, a container's files) under a snapshot id; create from it with
    /// `CreateSandboxRequest::snapshot`.
    pub async fn snapshot(
        &self,
        id: &str,
        req: &warren_types::CreateSnapshotRequest,
    ) -> Result<warren_types::SnapshotInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/snapshot", seg(id));
        self.call_json(Method::POST, &path, Some(req), "the snapshot")
            .await
    }

    /// `GET /v1/snapshots`: the snapshots the caller may see, oldest first.
    pub async fn snapshots(&self) -> Result<Vec<warren_types::SnapshotInfo>, ClientError> {
        let r: warren_types::SnapshotList = self
            .call_json(Method::GET, "/v1/snapshots", None::<&()>, "the snapshots")
            .await?;
        Ok(r.snapshots)
    }

    /// `GET /v1/snapshots/{id}`.
    pub async fn get_snapshot(&self, id: &str) -> Result<warren_types::SnapshotInfo, ClientError> {
        let path = format!("/v1/snapshots/{}", seg(id));
        self.call_json(Method::GET, &path, None::<&()>, "the snapshot")
            .await
    }

    /// `DELETE /v1/snapshots/{id}`: sandboxes made from it are not affected.
    pub async fn delete_snapshot(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/snapshots/{}", seg(id));
        self.call_empty(Method::DELETE, &path, None::<&()>).await
    }

    /// `POST /v1/sandboxes/{id}/revive`: a new sandbox made like `id`, with its logged calls
    /// run again in order; the report says where the replay first diverged, if it did.
    pub async fn revive(
        &self,
        id: &str,
        stop_on_divergence: bool,
    ) -> Result<warren_types::ReviveReport, ClientError> {
        let mut path = format!("/v1/sandboxes/{}/revive", seg(id));
        if stop_on_divergence {
            path.push_str("?stop_on_divergence=true");
        }
        self.call_json(Method::POST, &path, None::<&()>, "the revive report")
            .await
    }

    /// `POST /v1/sandboxes/{id}/extend`: the sandbox now expires `ttl_secs` from now.
    pub async fn extend(&self, id: &str, ttl_secs: u64) -> Result<SandboxInfo, ClientError> {
        let path = format!("/v1/sandboxes/{}/extend", seg(id));
        let body = serde_json::json!({ "ttl_secs": ttl_secs });
        self.call_json(Method::POST, &path, Some(&body), "the sandbox")
            .await
    }

    /// `GET /v1/sandboxes/{id}/stats`: its resource use now, against its limits.
    pub async fn stats(&self, id: &str) -> Result<warren_types::SandboxStats, ClientError> {
        let path = format!("/v1/sandboxes/{}/stats", seg(id));
        self.call_json(Method::GET, &path, None::<&()>, "the sandbox's stats")
            .await
    }

    /// `GET /metrics`: the Prometheus text.
    pub async fn metrics(&self) -> Result<String, ClientError> {
        let reply = self
            .send(Method::GET, "/metrics", empty_body(), None)
            .await?;
        let bytes = reply.into_stream().collect_bytes().await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_queries() {
        assert_eq!(list_query(&BTreeMap::new(), None), "");
        let labels: BTreeMap<String, String> = [
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "x y".to_string()),
        ]
        .into();
        assert_eq!(
            list_query(&labels, Some(SandboxState::Running)),
            "?label=a%3D1&label=b%3Dx%20y&state=running"
        );
    }

    #[test]
    fn health_keeps_unknown_fields() {
        let h: Health =
            serde_json::from_str(r#"{"status":"ok","node":"n1","version":"0.1.0","substrates":["container"],"uptime_secs":3}"#)
                .unwrap();
        assert!(h.is_ok());
        assert_eq!(h.extra["uptime_secs"], 3);
    }
}
