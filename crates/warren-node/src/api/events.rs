//! `GET /v1/events`: Server-Sent Events of what changes on the node, for live views (the
//! dashboard) that would otherwise poll.
//!
//! - `sandbox`: a sandbox the caller may see changed (created, paused, resumed, extended,
//!   failed...); data is its `SandboxInfo`.
//! - `deleted`: it is gone; data `{"id", "reason"}`.
//! - `load`: at once and then every `interval_ms` (default 2000, 250 to 60000), the node's
//!   load summary; data `{"node", "sandboxes", "load", "host"}` (as in `/v1/health`).
//! - `lagged`: the stream fell behind and lost this many changes (`{"missed"}`): read the list
//!   again.
//!
//! A comment line every 15 s keeps idle connections open through proxies.

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

use super::extract::{Auth, QueryPairs};
use super::HttpResult;
use crate::manager::{Event, Manager, SandboxChange, Subscription, Telemetry};

/// The events' names, as the stream sends them (`api/openapi.yaml` gives each one's data
/// schema under the route's `x-warren-events`; the tests check both against each other).
pub(crate) const SANDBOX: &str = "sandbox";
pub(crate) const DELETED: &str = "deleted";
pub(crate) const LOAD: &str = "load";
pub(crate) const LAGGED: &str = "lagged";
#[cfg(test)]
pub(crate) const NAMES: [&str; 4] = [SANDBOX, DELETED, LOAD, LAGGED];

const DEFAULT_INTERVAL_MS: u64 = 2000;
const INTERVAL_MS: std::ops::RangeInclusive<u64> = 250..=60_000;

struct Feed {
    manager: Manager,
    telemetry: Telemetry,
    sub: Subscription,
    ticks: tokio::time::Interval,
}

fn json_event(name: &str, data: &impl serde::Serialize) -> SseEvent {
    SseEvent::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|e| SseEvent::default().event("error").data(e.to_string()))
}

impl Feed {
    async fn next(&mut self) -> Option<SseEvent> {
        tokio::select! {
            ev = self.sub.next() => Some(match ev? {
                Event::Sandbox(SandboxChange::Changed(info)) => json_event(SANDBOX, &*info),
                Event::Sandbox(SandboxChange::Deleted { id, why, .. }) => json_event(
                    DELETED,
                    &serde_json::json!({ "id": id.as_str(), "reason": why }),
                ),
                Event::Lagged(n) => json_event(LAGGED, &serde_json::json!({ "missed": n })),
            }),
            _ = self.ticks.tick() => Some(json_event(
                LOAD,
                &serde_json::json!({
                    "node": self.manager.config().node.to_string(),
                    "sandboxes": self.manager.count(),
                    "load": self.telemetry.load(&self.manager),
                    "host": super::sandboxes::HostUsage::read(
                        self.telemetry.capacity(&self.manager).memory_total_mb
                    ),
                }),
            )),
        }
    }
}

pub async fn events(
    State(m): State<Manager>,
    State(telemetry): State<Telemetry>,
    Auth(caller): Auth,
    q: QueryPairs,
) -> HttpResult<Response> {
    q.only(&["interval_ms"], &[])?;
    let ms = q
        .parsed::<u64>("interval_ms", "a whole number of milliseconds")?
        .unwrap_or(DEFAULT_INTERVAL_MS);
    if !INTERVAL_MS.contains(&ms) {
        return Err(super::HttpError::invalid(format!(
            "interval_ms must be between {} and {}, got {ms}",
            INTERVAL_MS.start(),
            INTERVAL_MS.end()
        )));
    }
    let mut ticks = tokio::time::interval(Duration::from_millis(ms));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let feed = Feed {
        sub: telemetry.subscribe(&caller),
        manager: m,
        telemetry,
        ticks,
    };
    let stream = futures::stream::unfold(feed, |mut f| async move {
        let ev = f.next().await?;
        Some((Ok::<_, std::convert::Infallible>(ev), f))
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
