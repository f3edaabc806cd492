//! The daemon's logs: `--log-format text|json`, no ANSI colour in a file, and the request id
//! of each request in its log lines, its answer and its error body.

use std::time::Duration;

use crate::common::{raw_request_with, unknown_id, wait_for, Daemon};

/// `GET /v1/sandboxes/<unknown>` with `x-request-id: rid` (or none): the answer's id header
/// and its error body.
async fn missing(d: &Daemon, rid: Option<&str>) -> (String, serde_json::Value) {
    let headers: Vec<(&str, &str)> = rid.map(|r| ("x-request-id", r)).into_iter().collect();
    let (status, h, body) = raw_request_with(
        &d.socket,
        "GET",
        &format!("/v1/sandboxes/{}", unknown_id(&d.node)),
        None,
        &headers,
        Vec::new(),
    )
    .await;
    assert_eq!(status, 404);
    let id = h["x-request-id"].to_str().unwrap().to_string();
    (id, serde_json::from_slice(&body).unwrap())
}

/// The daemon's log once it holds `needle` (lines are written as requests end).
async fn log_with(d: &Daemon, needle: &str) -> String {
    wait_for(Duration::from_secs(10), || async {
        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        log.contains(needle).then_some(log)
    })
    .await
    .unwrap_or_else(|| panic!("no log line names {needle}:\n{}", d.log_tail(30)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_name_the_request_id_and_have_no_colour() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let (id, body) = missing(&d, Some("text-log-check-1")).await;
    assert_eq!(id, "text-log-check-1");
    assert_eq!(body["error"]["request_id"], "text-log-check-1");
    assert_eq!(body["error"]["code"], "not_found");
    // An id the daemon would not log as it is gets replaced by its own.
    let (id, body) = missing(&d, Some("no spaces allowed")).await;
    assert_ne!(id, "no spaces allowed");
    assert_eq!(body["error"]["request_id"], id.as_str());
    let (made, body) = missing(&d, None).await;
    assert_eq!(made.len(), 26, "a ULID: {made}");
    assert_eq!(body["error"]["request_id"], made.as_str());

    let log = log_with(&d, &format!("request_id={made}")).await;
    let line = log
        .lines()
        .find(|l| l.contains("request_id=text-log-check-1"))
        .unwrap_or_else(|| panic!("the request's line:\n{log}"));
    assert!(line.contains("/v1/sandboxes/"), "{line}");
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI escapes in a log file:\n{}",
        d.log_tail(10)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_a_line_with_the_request_id() {
    let Some(d) = Daemon::start_with(|_| vec!["--log-format".into(), "json".into()]).await else {
        return;
    };
    let (id, _) = missing(&d, Some("json-log-check-1")).await;
    assert_eq!(id, "json-log-check-1");
    let log = log_with(&d, "json-log-check-1").await;
    let mut of_request = 0;
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        let spans = v["spans"].as_array().cloned().unwrap_or_default();
        if spans.iter().any(|s| s["request_id"] == "json-log-check-1") {
            of_request += 1;
            assert!(
                v["path"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("/v1/sandboxes/"),
                "{line}"
            );
        }
    }
    assert!(of_request >= 1, "a line of the request:\n{log}");
    assert!(
        log.contains("\"message\":\"serving\""),
        "start-up lines are JSON too"
    );
}
