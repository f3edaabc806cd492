//! Warren's sandbox records in E2B's shapes, and E2B's template ids as Warren images.
//!
//! - A template id is an image reference (`debian-py:3`), a stack of them joined by commas
//!   (`debian-py:3,task-7:1`, lowest first), a snapshot id (`<node>-snap-<ulid>`), or `base`
//!   (the SDKs' default), which is the node's `default` image.
//! - `metadata` is the sandbox's labels; `startedAt` its creation; `endAt` its expiry (a
//!   sandbox without one, which E2B does not have, says 9999-12-31).
//! - States: `creating` and `running` are `running`, `paused` is `paused`; stopped and failed
//!   sandboxes do not exist for E2B.

use chrono::{DateTime, SecondsFormat, Utc};
use warren_types::{ImageRef, NetworkMode, SandboxInfo, SandboxState, SnapshotId};

use crate::wire;

/// The SDKs' default template.
pub const BASE_TEMPLATE: &str = "base";
/// The Warren image it stands for.
pub const DEFAULT_IMAGE: &str = "default";
/// `endAt` of a sandbox that never expires.
pub const NEVER: &str = "9999-12-31T23:59:59.000Z";

/// What a template id names.
#[derive(Debug, Clone, PartialEq)]
pub enum Template {
    Image(ImageRef),
    Snapshot(SnapshotId),
}

/// Reads a template id.
pub fn template(id: &str) -> Template {
    let id = id.trim();
    if let Ok(s) = id.parse::<SnapshotId>() {
        return Template::Snapshot(s);
    }
    if id.is_empty() || id == BASE_TEMPLATE {
        return Template::Image(ImageRef::Name(DEFAULT_IMAGE.into()));
    }
    if id.contains(',') {
        return Template::Image(ImageRef::Stack(
            id.split(',').map(|s| s.trim().to_string()).collect(),
        ));
    }
    Template::Image(ImageRef::Name(id.to_string()))
}

/// The template id of an image stack.
pub fn template_id(image: &[String]) -> String {
    if image.len() == 1 && image[0] == DEFAULT_IMAGE {
        return BASE_TEMPLATE.into();
    }
    image.join(",")
}

/// RFC 3339 in UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms as i64)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| NEVER.into())
}

/// E2B's state of a sandbox, or `None` for one E2B would not show (stopped, failed).
pub fn state(s: SandboxState) -> Option<&'static str> {
    match s {
        SandboxState::Creating | SandboxState::Running => Some("running"),
        SandboxState::Paused => Some("paused"),
        SandboxState::Stopped | SandboxState::Failed => None,
    }
}

/// The client id of a sandbox: the node that holds it.
fn client_id(info: &SandboxInfo) -> String {
    info.id
        .split_once('-')
        .map(|(n, _)| n.to_string())
        .unwrap_or_default()
}

/// A sandbox as listed; `None` when E2B would not show it.
pub fn listed(info: &SandboxInfo, envd_version: &str) -> Option<wire::ListedSandbox> {
    Some(wire::ListedSandbox {
        template_id: template_id(&info.image),
        sandbox_id: info.id.clone(),
        client_id: client_id(info),
        started_at: rfc3339(info.created_at_ms),
        end_at: info
            .expires_at_ms
            .map(rfc3339)
            .unwrap_or_else(|| NEVER.into()),
        cpu_count: (info.limits.cpus.ceil() as u64).max(1),
        memory_mb: info.limits.memory_mb,
        disk_size_mb: info.limits.disk_mb,
        state: state(info.state)?.into(),
        envd_version: envd_version.into(),
        metadata: info.labels.clone(),
    })
}

/// What the front adds to a record to answer for one sandbox.
#[derive(Debug, Clone)]
pub struct Extras<'a> {
    pub envd_version: &'a str,
    pub envd_access_token: Option<String>,
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}`; `None` when E2B would not show it.
pub fn detail(info: &SandboxInfo, x: &Extras<'_>) -> Option<wire::SandboxDetail> {
    Some(wire::SandboxDetail {
        listed: listed(info, x.envd_version)?,
        envd_access_token: x.envd_access_token.clone(),
        domain: x.domain.clone(),
        allow_internet_access: Some(info.network.mode == NetworkMode::Allow),
        lifecycle: wire::Lifecycle {
            // Any call to a paused Warren sandbox resumes it.
            auto_resume: true,
            on_timeout: if info.idle_timeout_secs.is_some() && info.expires_at_ms.is_none() {
                "pause".into()
            } else {
                "kill".into()
            },
        },
    })
}

/// A created, connected or resumed sandbox.
pub fn created(info: &SandboxInfo, x: &Extras<'_>) -> wire::Sandbox {
    wire::Sandbox {
        template_id: template_id(&info.image),
        sandbox_id: info.id.clone(),
        client_id: client_id(info),
        envd_version: x.envd_version.into(),
        envd_access_token: x.envd_access_token.clone(),
        traffic_access_token: None,
        domain: x.domain.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_images_stacks_or_snapshots() {
        assert_eq!(
            template("base"),
            Template::Image(ImageRef::Name("default".into()))
        );
        assert_eq!(
            template("debian-py:3"),
            Template::Image(ImageRef::Name("debian-py:3".into()))
        );
        assert_eq!(
            template("a:1, b:2"),
            Template::Image(ImageRef::Stack(vec!["a:1".into(), "b:2".into()]))
        );
        let snap = SnapshotId::generate(&"n1".parse().unwrap());
        assert_eq!(template(snap.as_str()), Template::Snapshot(snap.clone()));
        assert_eq!(template_id(&["default".into()]), "base");
        assert_eq!(template_id(&["a:1".into(), "b:2".into()]), "a:1,b:2");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
    }
}
