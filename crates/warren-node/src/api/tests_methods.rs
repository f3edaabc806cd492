//! A method a path does not take: 405 with the API's JSON error and an `Allow` header naming
//! the methods the path does take, on every path of [`super::ROUTES`].

use std::collections::{BTreeMap, BTreeSet};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use warren_types::{ErrorBody, ErrorCode};

use crate::testing::manager_in;

#[tokio::test]
async fn a_wrong_method_is_405_with_allow_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m, None));
    let mut by_path: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (method, path) in super::ROUTES.iter().copied() {
        by_path.entry(path).or_default().insert(method);
    }
    let mut tried = 0;
    for (path, served) in by_path {
        // A sandbox's ports take every method (the server inside answers).
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
    assert!(tried > 100, "only {tried} wrong methods tried");
}
