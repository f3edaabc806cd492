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

/// `api/openapi.yaml`.
fn spec() -> serde_yaml::Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Checks `v` against an OpenAPI 3.0 schema of `spec` (`$ref`, `allOf`, `nullable`, `type`,
/// `enum`, `required`, `properties`, `additionalProperties`, `items`): every field the data
/// has is described, every required one is there, with its type. Answers what differs.
fn check(spec: &serde_yaml::Value, schema: &serde_yaml::Value, v: &serde_json::Value, at: &str) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        let named = &spec["components"]["schemas"][name];
        assert!(!named.is_null(), "{at}: no schema {name}");
        return check(spec, named, v, at);
    }
    if let Some(all) = schema["allOf"].as_sequence() {
        for s in all {
            check(spec, s, v, at);
        }
    }
    if v.is_null() {
        let typed = !schema["type"].is_null() || schema["allOf"].is_sequence();
        assert!(
            !typed || schema["nullable"].as_bool() == Some(true),
            "{at}: null where the spec says not nullable"
        );
        return;
    }
    if let Some(values) = schema["enum"].as_sequence() {
        let known: Vec<&str> = values.iter().filter_map(|x| x.as_str()).collect();
        assert!(
            v.as_str().is_some_and(|x| known.contains(&x)),
            "{at}: {v} is not one of {known:?}"
        );
    }
    let ok = match schema["type"].as_str() {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some(t) => panic!("{at}: unknown type {t}"),
    };
    assert!(ok, "{at}: {v} is not of type {:?}", schema["type"]);
    if let Some(obj) = v.as_object() {
        for req in schema["required"].as_sequence().into_iter().flatten() {
            let req = req.as_str().unwrap();
            assert!(
                obj.contains_key(req),
                "{at}: required field {req} missing: {v}"
            );
        }
        let props = schema["properties"].as_mapping();
        for (k, x) in obj {
            let field = props.and_then(|p| p.get(k.as_str()));
            match (field, &schema["additionalProperties"]) {
                (Some(s), _) => check(spec, s, x, &format!("{at}.{k}")),
                (None, serde_yaml::Value::Mapping(_)) => check(
                    spec,
                    &schema["additionalProperties"],
                    x,
                    &format!("{at}.{k}"),
                ),
                (None, serde_yaml::Value::Bool(true)) => {}
                // Without properties the object is a free map (described in words).
                (None, _) if props.is_none() => {}
                (None, _) => panic!("{at}: field {k} is not in the spec: {v}"),
            }
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), v.as_array()) {
        for (i, x) in arr.iter().enumerate() {
            check(spec, items, x, &format!("{at}[{i}]"));
        }
    }
}

/// The stream's events, as sent, against `x-warren-events` of `GET /v1/events` in the spec:
/// the same names, and each event's data described by its schema. A lag is made by a reader
/// that reads nothing while more changes than the channel keeps go by.
#[tokio::test]
async fn every_event_is_as_the_spec_says() {
    let spec = spec();
    let events = &spec["paths"]["/v1/events"]["get"]["responses"]["200"]["x-warren-events"];
    let named: std::collections::BTreeSet<&str> = events
        .as_mapping()
        .expect("x-warren-events of GET /v1/events")
        .keys()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert_eq!(
        named,
        super::events::NAMES.into_iter().collect(),
        "the stream's event names"
    );

    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    let (_, mut reader) = open(&app, "/v1/events?interval_ms=250", None).await;
    let (_, mut behind) = open(&app, "/v1/events", None).await;
    let mut seen = Vec::new();
    seen.push((super::events::LOAD, reader.next("load").await));
    // The slow reader has its subscription once its first event (a load) is read.
    behind.next("load").await;
    let info = m
        .create(CreateSandboxRequest {
            labels: [("a".to_string(), "b".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .info;
    seen.push((super::events::SANDBOX, reader.next("sandbox").await));
    let id: SandboxId = info.id.parse().unwrap();
    for _ in 0..1100 {
        m.extend(&id, 3600).await.unwrap();
    }
    m.delete(&id).await.unwrap();
    seen.push((super::events::DELETED, reader.next("deleted").await));
    seen.push((super::events::LAGGED, behind.next("lagged").await));
    for (name, data) in &seen {
        check(&spec, &events[*name], data, name);
    }
    assert!(seen
        .iter()
        .any(|(n, d)| *n == "lagged" && d["missed"].as_u64() > Some(0)));
}
