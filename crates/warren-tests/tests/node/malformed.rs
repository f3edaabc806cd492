//! Malformed requests get a 4xx with a JSON error code, never a 5xx, and never leave a
//! sandbox behind.

use warren_client::{ErrorBody, ErrorCode};

use crate::common::{raw_request, unknown_id, Daemon};

const JSON: Option<&str> = Some("application/json");

/// One request and what must come back: any 4xx (`None`) or this exact code.
struct Case {
    method: &'static str,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
    code: Option<ErrorCode>,
}

fn case(
    method: &'static str,
    path: impl Into<String>,
    body: &str,
    code: Option<ErrorCode>,
) -> Case {
    Case {
        method,
        path: path.into(),
        content_type: if body.is_empty() { None } else { JSON },
        body: body.as_bytes().to_vec(),
        code,
    }
}

const INVALID: Option<ErrorCode> = Some(ErrorCode::InvalidRequest);
const PATH: Option<ErrorCode> = Some(ErrorCode::InvalidPath);
const NOT_FOUND: Option<ErrorCode> = Some(ErrorCode::NotFound);

fn cases(id: &str, missing: &str) -> Vec<Case> {
    let sb = format!("/v1/sandboxes/{id}");
    let mut v = vec![
        // Create: bad JSON, unknown fields, negative and out-of-range limits, bad values.
        case("POST", "/v1/sandboxes", "{", INVALID),
        case("POST", "/v1/sandboxes", "not json", INVALID),
        case("POST", "/v1/sandboxes", "[]", INVALID),
        case("POST", "/v1/sandboxes", "null", INVALID),
        case("POST", "/v1/sandboxes", r#"{"bogus":1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"memory_mb":-1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"memory_mb":1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"memory_mb":1e30}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"cpus":-2}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"cpus":0}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"cpus":"many"}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"cpus":1000}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"disk_mb":-5}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"disk_mb":0}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"pids":-1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"pids":1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"ttl_secs":-1}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"ttl_secs":0}"#, INVALID),
        case(
            "POST",
            "/v1/sandboxes",
            r#"{"idle_timeout_secs":0}"#,
            INVALID,
        ),
        case(
            "POST",
            "/v1/sandboxes",
            r#"{"substrate":"lambda"}"#,
            INVALID,
        ),
        case("POST", "/v1/sandboxes", r#"{"image":"../etc"}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"image":[]}"#, INVALID),
        case(
            "POST",
            "/v1/sandboxes",
            r#"{"image":"no-such-image"}"#,
            None,
        ),
        case("POST", "/v1/sandboxes", r#"{"labels":{"":"x"}}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"env":{"A=B":"c"}}"#, INVALID),
        case("POST", "/v1/sandboxes", r#"{"workdir":"relative"}"#, None),
        case("POST", "/v1/sandboxes", r#"{"user":"Root;rm"}"#, INVALID),
        case(
            "POST",
            "/v1/sandboxes",
            r#"{"hostname":"-bad host"}"#,
            INVALID,
        ),
        case(
            "POST",
            "/v1/sandboxes",
            r#"{"idempotency_key":""}"#,
            INVALID,
        ),
        case("POST", "/v1/sandboxes", r#"{"network":"host"}"#, INVALID),
        // Ids: malformed ones are invalid, well-formed unknown ones are not found.
        case("GET", "/v1/sandboxes/not-an-id", "", INVALID),
        case(
            "GET",
            "/v1/sandboxes/UPPER-01JD0M7X4E8K0K9YQ1W2E3R4T5",
            "",
            INVALID,
        ),
        case("GET", "/v1/sandboxes/n1-", "", INVALID),
        case("GET", "/v1/sandboxes/%ff%fe", "", None),
        case("GET", "/v1/sandboxes/..%2F..%2Fetc", "", None),
        case("GET", format!("/v1/sandboxes/{missing}"), "", NOT_FOUND),
        case("DELETE", format!("/v1/sandboxes/{missing}"), "", NOT_FOUND),
        case("DELETE", "/v1/sandboxes/bad!id", "", INVALID),
        case(
            "POST",
            format!("/v1/sandboxes/{missing}/exec"),
            r#"{"argv":["true"]}"#,
            NOT_FOUND,
        ),
        case(
            "GET",
            format!("/v1/sandboxes/{missing}/files?path=/etc/hostname"),
            "",
            NOT_FOUND,
        ),
        case(
            "GET",
            format!("/v1/sandboxes/{missing}/processes"),
            "",
            NOT_FOUND,
        ),
        // Routes and methods.
        case("GET", "/v1/nope", "", NOT_FOUND),
        case("GET", format!("{sb}/nope/deeper"), "", NOT_FOUND),
        case("PATCH", "/v1/sandboxes", "", None),
        case("PUT", format!("{sb}/exec"), "", None),
        // List filters.
        case("GET", "/v1/sandboxes?state=bogus", "", INVALID),
        case("GET", "/v1/sandboxes?label=noequals", "", INVALID),
        case("GET", "/v1/sandboxes?junk=1", "", INVALID),
        // Exec bodies.
        case("POST", format!("{sb}/exec"), "{", INVALID),
        case("POST", format!("{sb}/exec"), "{}", INVALID),
        case("POST", format!("{sb}/exec"), r#"{"argv":[]}"#, INVALID),
        case("POST", format!("{sb}/exec"), r#"{"argv":[""]}"#, INVALID),
        case("POST", format!("{sb}/exec"), r#"{"argv":"true"}"#, INVALID),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"shell":"true"}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"bogus":1}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"timeout_secs":-1}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"timeout_secs":0}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"max_output_bytes":-1}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"max_output_bytes":1e20}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"max_output_bytes":999999999999}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"cwd":"/../x"}"#,
            PATH,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"cwd":"rel"}"#,
            PATH,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"env":{"":"x"}}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"user":"Nobody!"}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec"),
            r#"{"argv":["true"],"encoding":"rot13"}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec/stream"),
            r#"{"argv":[]}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/exec/stream"),
            r#"{"shell":"true","nope":0}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/processes"),
            r#"{"argv":["true"],"timeout_secs":-3}"#,
            INVALID,
        ),
        case("POST", format!("{sb}/processes"), "[1,2]", INVALID),
        // Processes.
        case("GET", format!("{sb}/processes/abc"), "", INVALID),
        case("GET", format!("{sb}/processes/0"), "", INVALID),
        case("GET", format!("{sb}/processes/-1"), "", INVALID),
        case("GET", format!("{sb}/processes/99999"), "", NOT_FOUND),
        case("POST", format!("{sb}/processes/99999/wait"), "", NOT_FOUND),
        case(
            "POST",
            format!("{sb}/processes/99999/wait?timeout_secs=abc"),
            "",
            None,
        ),
        case(
            "POST",
            format!("{sb}/processes/99999/kill"),
            r#"{"signal":9}"#,
            NOT_FOUND,
        ),
        case(
            "POST",
            format!("{sb}/processes/99999/kill"),
            r#"{"signal":"KILL"}"#,
            None,
        ),
        case(
            "POST",
            format!("{sb}/processes/99999/kill"),
            r#"{"signal":999}"#,
            None,
        ),
        // Files: missing or escaping paths, bad parameters, bad bodies.
        case("GET", format!("{sb}/files"), "", INVALID),
        case("GET", format!("{sb}/files?path=/../etc/passwd"), "", PATH),
        case(
            "GET",
            format!("{sb}/files?path=%2F..%2F..%2Fetc%2Fshadow"),
            "",
            PATH,
        ),
        case("GET", format!("{sb}/files?path=/etc/%00passwd"), "", PATH),
        case("GET", format!("{sb}/files?path=etc/passwd"), "", PATH),
        case(
            "GET",
            format!("{sb}/files?path=/etc/hostname&junk=1"),
            "",
            INVALID,
        ),
        case("GET", format!("{sb}/files?path=/a&path=/b"), "", INVALID),
        case("GET", format!("{sb}/files/stat?path=/.."), "", PATH),
        case("GET", format!("{sb}/files/list?path=relative"), "", PATH),
        case(
            "GET",
            format!("{sb}/files/list?path=/no/such/dir"),
            "",
            NOT_FOUND,
        ),
        case("DELETE", format!("{sb}/files?path=/.."), "", PATH),
        case(
            "DELETE",
            format!("{sb}/files?path=/tmp&recursive=maybe"),
            "",
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/files/mkdir"),
            r#"{"path":"/../x"}"#,
            PATH,
        ),
        case(
            "POST",
            format!("{sb}/files/mkdir"),
            r#"{"path":"/x","bogus":true}"#,
            INVALID,
        ),
        case("POST", format!("{sb}/files/mkdir"), "{}", INVALID),
        case(
            "POST",
            format!("{sb}/files/mkdir"),
            r#"{"path":"/x","mode":-1}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/files/chmod"),
            r#"{"path":"/tmp","mode":-1}"#,
            INVALID,
        ),
        case(
            "POST",
            format!("{sb}/files/chmod"),
            r#"{"path":"/../tmp","mode":448}"#,
            PATH,
        ),
        case(
            "POST",
            format!("{sb}/files/chmod"),
            r#"{"path":"/tmp"}"#,
            INVALID,
        ),
        // A terminal request that is not a WebSocket upgrade, and bad terminal sizes.
        case("GET", format!("{sb}/pty"), "", None),
        case("GET", format!("{sb}/pty?cols=abc"), "", None),
    ];
    // Uploads with escaping paths or bad modes; the body must not land anywhere.
    for (path, code) in [
        (format!("{sb}/files?path=/a/../../x"), PATH),
        (format!("{sb}/files?path=/ok&mode=rw"), INVALID),
        (format!("{sb}/files?path=/ok&mode=-1"), INVALID),
    ] {
        v.push(Case {
            method: "PUT",
            path,
            content_type: Some("application/octet-stream"),
            body: b"payload".to_vec(),
            code,
        });
    }
    // JSON bodies must say they are JSON (or say nothing).
    v.push(Case {
        method: "POST",
        path: "/v1/sandboxes".into(),
        content_type: Some("text/plain"),
        body: b"{}".to_vec(),
        code: INVALID,
    });
    // Bytes that are not UTF-8.
    v.push(Case {
        method: "POST",
        path: "/v1/sandboxes".into(),
        content_type: JSON,
        body: vec![0xff, 0xfe, b'{', 0x80],
        code: INVALID,
    });
    v.push(Case {
        method: "POST",
        path: format!("{sb}/exec"),
        content_type: JSON,
        body: b"{\"argv\":[\"\xff\"]}".to_vec(),
        code: INVALID,
    });
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_4xx_and_leave_nothing() {
    let Some(d) = Daemon::start().await else {
        return;
    };
    let id = d.sandbox().await;
    let missing = unknown_id(&d.node);
    let mut failures = Vec::new();
    for c in cases(&id, &missing) {
        let (status, ct, body) =
            raw_request(&d.socket, c.method, &c.path, c.content_type, c.body.clone()).await;
        let what = format!(
            "{} {} {:?}",
            c.method,
            c.path,
            String::from_utf8_lossy(&c.body)
        );
        if !(400..500).contains(&status) {
            failures.push(format!(
                "{what}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            ));
            continue;
        }
        if !ct.starts_with("application/json") {
            failures.push(format!("{what}: HTTP {status} with Content-Type {ct:?}"));
            continue;
        }
        let err: ErrorBody = match serde_json::from_slice(&body) {
            Ok(e) => e,
            Err(e) => {
                failures.push(format!(
                    "{what}: HTTP {status}, body is not an error document ({e}): {}",
                    String::from_utf8_lossy(&body)
                ));
                continue;
            }
        };
        if err.error.message.is_empty() {
            failures.push(format!("{what}: empty error message"));
        }
        if status != err.error.code.http_status() && status != 405 {
            failures.push(format!(
                "{what}: HTTP {status} does not match code {} ({})",
                err.error.code,
                err.error.code.http_status()
            ));
        }
        if let Some(want) = c.code {
            if err.error.code != want {
                failures.push(format!(
                    "{what}: code {} ({}), expected {want}",
                    err.error.code, err.error.message
                ));
            }
        }
    }
    // The daemon is fine, and nothing was made or written by the refused calls.
    let h = d
        .client()
        .health()
        .await
        .expect("health after malformed requests");
    assert!(h.is_ok());
    let list = d.list().await;
    let ids: Vec<&str> = list.iter().map(|s| s.id.as_str()).collect();
    if ids != [id.as_str()] {
        failures.push(format!("sandboxes after the malformed requests: {ids:?}"));
    }
    for p in ["/ok", "/x", "/a"] {
        if d.sh(&id, &format!("test -e {p}")).await.success() {
            failures.push(format!("{p} was created by a refused call"));
        }
    }
    assert_eq!(d.sh_ok(&id, "echo ok").await, "ok\n");
    d.client().delete(&id).await.unwrap();
    let left = d.list().await;
    if !left.is_empty() {
        failures.push(format!("sandboxes left after deleting: {left:?}"));
    }
    for dir in d.cgroup_dirs("") {
        let subs: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        if !subs.is_empty() {
            failures.push(format!("{} still has groups {subs:?}", dir.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} malformed request(s) were mishandled:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
