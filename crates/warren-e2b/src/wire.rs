//! E2B's control-plane JSON shapes, as the `e2b` SDKs send and read them (field names in
//! E2B's camelCase, ids spelled `ID`). Written from the published API description; only the
//! fields Warren reads or answers are here. Unknown request fields are ignored, so a newer
//! SDK's additions do not break a create; the fields that would change what a sandbox is
//! (volumes, MCP, network rules, IAM) are checked by the handlers and refused when set.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Lifetime in seconds from now (E2B's default: 300).
    #[serde(default)]
    pub timeout: Option<i64>,
    /// Pause instead of kill when the timeout ends.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    #[serde(default)]
    pub auto_resume: Option<Value>,
    /// Deprecated by E2B (every sandbox is secured); accepted and ignored.
    #[serde(default)]
    pub secure: Option<bool>,
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    #[serde(default)]
    pub network: Option<Value>,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub mcp: Option<Value>,
    #[serde(default)]
    pub iam: Option<Value>,
    #[serde(default)]
    pub volume_mounts: Option<Vec<Value>>,
}

/// A created, connected or resumed sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: Option<String>,
    #[serde(rename = "trafficAccessToken")]
    pub traffic_access_token: Option<String>,
    pub domain: Option<String>,
}

/// What a sandbox does when its timeout ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: String,
}

/// `GET /sandboxes/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxDetail {
    #[serde(flatten)]
    pub listed: ListedSandbox,
    #[serde(rename = "envdAccessToken")]
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
    #[serde(rename = "allowInternetAccess")]
    pub allow_internet_access: Option<bool>,
    pub lifecycle: Lifecycle,
}

/// One sandbox of `GET /sandboxes` and `GET /v2/sandboxes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedSandbox {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// RFC 3339.
    #[serde(rename = "startedAt")]
    pub started_at: String,
    #[serde(rename = "endAt")]
    pub end_at: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: String,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    pub metadata: BTreeMap<String, String>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeoutRequest {
    pub timeout: i64,
}

/// `POST /sandboxes/{id}/refreshes`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct RefreshRequest {
    #[serde(default)]
    pub duration: Option<i64>,
}

/// `POST /sandboxes/{id}/connect`, `/v2/sandboxes/{id}/connect` and `/resume`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectRequest {
    #[serde(default)]
    pub timeout: Option<i64>,
    /// `false` asks for a resume without the saved memory (a cold start).
    #[serde(default)]
    pub memory: Option<bool>,
    /// Older SDKs' resume body.
    #[serde(default, rename = "autoPause")]
    pub auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PauseRequest {
    /// `false` asks for a pause that keeps the files only.
    #[serde(default)]
    pub memory: Option<bool>,
    #[serde(default)]
    pub require_healthy_guest: Option<bool>,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SnapshotRequest {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub memory: Option<bool>,
}

/// A snapshot (`POST /sandboxes/{id}/snapshots`, `GET /snapshots`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    pub names: Vec<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForkRequest {
    #[serde(default)]
    pub timeout: Option<i64>,
    #[serde(default)]
    pub count: Option<i64>,
}

/// One child of a fork: a sandbox or why it could not start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForkResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Error>,
}

/// A template (`GET /templates`): a Warren image.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Template {
    #[serde(rename = "templateID")]
    pub template_id: String,
    #[serde(rename = "buildID")]
    pub build_id: String,
    #[serde(rename = "cpuCount")]
    pub cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    pub public: bool,
    pub aliases: Vec<String>,
    pub names: Vec<String>,
    #[serde(rename = "createdAt")]
    pub created_at: String,
    #[serde(rename = "updatedAt")]
    pub updated_at: String,
    #[serde(rename = "createdBy")]
    pub created_by: Option<Value>,
    #[serde(rename = "lastSpawnedAt")]
    pub last_spawned_at: Option<String>,
    #[serde(rename = "spawnCount")]
    pub spawn_count: u64,
    #[serde(rename = "buildCount")]
    pub build_count: u64,
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// `ready`.
    #[serde(rename = "buildStatus")]
    pub build_status: String,
}

/// E2B's error body: the HTTP status again as `code`, and a message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Error {
    pub code: u16,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_as_the_sdk_sends_it() {
        let body = r#"{"templateID":"base","autoPause":false,"autoPauseMemory":true,
            "metadata":{"run":"7"},"envVars":{"A":"1"},"timeout":60,"secure":true,
            "someFutureField":{"x":1}}"#;
        let n: NewSandbox = serde_json::from_str(body).unwrap();
        assert_eq!(n.template_id, "base");
        assert_eq!(n.timeout, Some(60));
        assert_eq!(n.metadata.unwrap()["run"], "7");
        assert_eq!(n.env_vars.unwrap()["A"], "1");
        assert!(serde_json::from_str::<NewSandbox>(r#"{"timeout":1}"#).is_err());
    }

    #[test]
    fn a_detail_has_the_listed_fields_flat() {
        let d = SandboxDetail {
            listed: ListedSandbox {
                template_id: "base".into(),
                sandbox_id: "n1-x".into(),
                client_id: "n1".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
                end_at: "2026-01-01T00:05:00Z".into(),
                cpu_count: 1,
                memory_mb: 512,
                disk_size_mb: 512,
                state: "running".into(),
                envd_version: "0.5.7".into(),
                metadata: BTreeMap::new(),
            },
            envd_access_token: Some("t".into()),
            domain: None,
            allow_internet_access: None,
            lifecycle: Lifecycle {
                auto_resume: false,
                on_timeout: "kill".into(),
            },
        };
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["sandboxID"], "n1-x");
        assert_eq!(v["endAt"], "2026-01-01T00:05:00Z");
        assert_eq!(v["lifecycle"]["onTimeout"], "kill");
        let back: SandboxDetail = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
