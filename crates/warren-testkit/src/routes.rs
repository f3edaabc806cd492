//! Checks over a server's whole route table.

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use tower::ServiceExt;
use warren_types::{ErrorBody, ErrorCode};

/// Sends every method a path of `routes` (method, path) does not take to `app` and checks
/// the answer: 405 with the API's JSON error (`invalid_request`, naming the method) and an
/// `Allow` header naming the methods the path does take. A sandbox's ports are skipped (they
/// take every method: the server inside answers). Returns how many wrong methods were tried.
pub async fn wrong_methods_answer_405<'a>(
    app: Router,
    routes: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> usize {
    let mut by_path: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (method, path) in routes {
        by_path.entry(path).or_default().insert(method);
    }
    let mut tried = 0;
    for (path, served) in by_path {
        if path.contains("/ports/") {
            continue;
        }
        let uri = path
            .replace("{id}", "sb-x")
            .replace("{pid}", "1")
            .replace("{ref}", "img");
        for wrong in ["GET", "PUT", "POST", "DELETE", "PATCH"] {
            if served.contains(wrong) {
                continue;
            }
            let req = Request::builder()
                .method(wrong)
                .uri(&uri)
                .body(Body::empty())
                .unwrap();
            let resp = app.clone().oneshot(req).await.unwrap();
            let what = format!("{wrong} {uri}");
            assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{what}");
            let allow: BTreeSet<String> = resp
                .headers()
                .get(header::ALLOW)
                .unwrap_or_else(|| panic!("{what}: no Allow header"))
                .to_str()
                .unwrap()
                .split(',')
                .map(|m| m.trim().to_string())
                .filter(|m| m != "HEAD")
                .collect();
            let want: BTreeSet<String> = served.iter().map(|m| m.to_string()).collect();
            assert_eq!(allow, want, "{what}: Allow");
            assert_eq!(
                resp.headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok()),
                Some("application/json"),
                "{what}"
            );
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let e: ErrorBody = serde_json::from_slice(&body)
                .unwrap_or_else(|e| panic!("{what}: {e}: {}", String::from_utf8_lossy(&body)));
            assert_eq!(e.error.code, ErrorCode::InvalidRequest, "{what}");
            assert!(
                e.error.message.contains(wrong),
                "{what}: {}",
                e.error.message
            );
            tried += 1;
        }
    }
    tried
}
