//! The web dashboard at `/ui`, served by `warrend` and by the cluster gateway.
//!
//! Three static files (HTML, CSS, JavaScript) compiled into the binary: nothing is fetched
//! from anywhere else, and the page reads only the JSON API of the server that served it
//! (same origin), so it works alike on a node and on a gateway. The routes here take no
//! token: the page itself holds no data. The token a user enters is kept in the browser's
//! `sessionStorage` and sent as `Authorization: Bearer` on every API call, where the API
//! decides what the caller may see and do; this module never sees it.
//!
//! The page writes any script error into its `#errors` element and marks the page it has
//! drawn in `body[data-ready]`, which the browser tests check.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The routes of the dashboard, `(method, path)`; `api/openapi.yaml` lists them
/// (`x-warren-ui`).
pub const ROUTES: &[(&str, &str)] = &[("GET", "/ui"), ("GET", "/ui/{asset}")];

/// The assets: name, content type, bytes.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../assets/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../assets/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../assets/app.css"),
    ),
];

/// Scripts only from this origin, no inline script, no frames, API calls to this origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard's router, to merge beside the API's (any state).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { asset("index.html") }))
        .route(
            "/ui/{asset}",
            get(|Path(name): Path<String>| async move { asset(&name) }),
        )
}

fn asset(name: &str) -> Response {
    let Some((_, ctype, body)) = ASSETS.iter().find(|(n, _, _)| *n == name) else {
        return (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({"error": {
                "code": "not_found",
                "message": format!("no dashboard asset {name:?}"),
            }})
            .to_string(),
        )
            .into_response();
    };
    let mut resp = (StatusCode::OK, *body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn get(path: &str) -> (StatusCode, String, String) {
        let resp = router::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let ctype = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, ctype, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn serves_the_page_and_its_assets() {
        let (status, ctype, body) = get("/ui").await;
        assert_eq!(status, StatusCode::OK);
        assert!(ctype.starts_with("text/html"), "{ctype}");
        assert!(body.contains("/ui/app.js") && body.contains("/ui/app.css"));
        let (status, ctype, _) = get("/ui/app.js").await;
        assert_eq!(
            (status, ctype.starts_with("text/javascript")),
            (StatusCode::OK, true)
        );
        let (status, ctype, _) = get("/ui/app.css").await;
        assert_eq!(
            (status, ctype.starts_with("text/css")),
            (StatusCode::OK, true)
        );
        let (status, ctype, body) = get("/ui/..%2Fetc%2Fpasswd").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(ctype, "application/json");
        assert!(body.contains("not_found"), "{body}");
        // Whatever the name holds, the error is JSON (a quote in it once broke the body).
        for name in ["%22AAA%22", "a%5Cb", "%7B%7D%0A"] {
            let (status, _, body) = get(&format!("/ui/{name}")).await;
            assert_eq!(status, StatusCode::NOT_FOUND);
            let v: serde_json::Value = serde_json::from_str(&body).expect(&body);
            assert_eq!(v["error"]["code"], "not_found");
        }
    }

    #[test]
    fn nothing_is_loaded_from_elsewhere() {
        // Every asset is ours: no URL of another origin in the page, the styles or the script.
        for (name, _, body) in ASSETS {
            for bad in ["http://", "https://", "//cdn", "@import"] {
                assert!(!body.contains(bad), "{name} refers to {bad}");
            }
        }
    }
}
