//! `GET /v1/events` through the router: refusals of bad parameters, the first `load` event at
//! once, changes in order, and a user's stream holding only its tenant's sandboxes.

use crate::testing::Calls as _;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use futures::StreamExt;
use tower::ServiceExt;
use warren_types::{Caller, CreateSandboxRequest, Quotas, Role, SandboxId, SandboxInfo};

use crate::testing::manager_in;

/// The events read so far and the bytes of an event not complete yet.
struct Events {
    body: axum::body::BodyDataStream,
    buf: String,
}

async fn open(app: &axum::Router, uri: &str, caller: Option<Caller>) -> (StatusCode, Events) {
    let mut req = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    if let Some(c) = caller {
        req.extensions_mut().insert(c);
    }
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let events = Events {
        body: resp.into_body().into_data_stream(),
        buf: String::new(),
    };
    (status, events)
}

impl Events {
    /// The data of the next event named `name` (others are skipped), within 10 s.
    async fn next(&mut self, name: &str) -> serde_json::Value {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let event: String = self.buf.drain(..end + 2).collect();
                let mut kind = "";
                let mut data = String::new();
                for line in event.lines() {
                    if let Some(k) = line.strip_prefix("event: ") {
                        kind = k;
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                if kind == name {
                    return serde_json::from_str(&data).unwrap();
                }
            }
            let chunk = tokio::time::timeout_at(deadline, self.body.next())
                .await
                .unwrap_or_else(|_| panic!("no {name} event within 10 s; have {:?}", self.buf))
                .expect("the stream ended")
                .unwrap();
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test]
async fn events_tell_changes_and_load_to_those_who_may_see_them() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    for bad in [
        "/v1/events?interval_ms=10",
        "/v1/events?interval_ms=x",
        "/v1/events?other=1",
    ] {
        let (status, _) = open(&app, bad, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }

    let (status, mut admin) = open(&app, "/v1/events?interval_ms=250", None).await;
    assert_eq!(status, StatusCode::OK);
    let load = admin.next("load").await;
    assert_eq!(load["sandboxes"], 0);
    assert_eq!(load["node"], m.config().node.to_string());
    let team_a = Caller::tenant("team-a", Role::User, Quotas::default());
    let (_, mut user) = open(&app, "/v1/events", Some(team_a.clone())).await;

    let theirs = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let ours = m
        .create_as(&team_a, CreateSandboxRequest::default())
        .await
        .unwrap()
        .info;
    let seen: SandboxInfo = serde_json::from_value(admin.next("sandbox").await).unwrap();
    assert_eq!(seen.id, theirs.id);
    assert_eq!(seen.state, warren_types::SandboxState::Running);
    let seen: SandboxInfo = serde_json::from_value(admin.next("sandbox").await).unwrap();
    assert_eq!(seen.id, ours.id, "the admin sees every tenant's");
    let seen: SandboxInfo = serde_json::from_value(user.next("sandbox").await).unwrap();
    assert_eq!(seen.id, ours.id, "a user sees its own tenant's only");

    let id: SandboxId = ours.id.parse().unwrap();
    m.pause(&id).await.unwrap();
    let seen: SandboxInfo = serde_json::from_value(user.next("sandbox").await).unwrap();
    assert_eq!(
        (seen.id.as_str(), seen.state),
        (ours.id.as_str(), warren_types::SandboxState::Paused)
    );
    m.delete(&id).await.unwrap();
    let gone = user.next("deleted").await;
    assert_eq!(gone["id"], ours.id);
    let load = admin.next("load").await;
    assert_eq!(load["sandboxes"], 1, "the load follows");
}
