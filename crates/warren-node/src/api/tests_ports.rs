//! The ports route over the fake runtime, whose sandboxes have one HTTP server
//! ([`crate::testing::FAKE_HTTP_PORT`]) that answers the request it got: what reaches the
//! server (path and query as written, headers filtered), what comes back (status, body,
//! `Warren-Port`), upgrades, and Warren's own refusals.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;
use warren_types::{Caller, CreateSandboxRequest, ErrorBody, ErrorCode, Quotas, Role};

use crate::testing::{manager_in, Calls, FAKE_HTTP_PORT};

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &axum::Router, req: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

fn req(method: Method, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri)
}

fn code(a: &Answer) -> ErrorCode {
    serde_json::from_str::<ErrorBody>(&a.body)
        .unwrap_or_else(|e| panic!("not an error ({e}): {}", a.body))
        .error
        .code
}

#[tokio::test]
async fn requests_reach_the_server_inside_and_answers_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    let id = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info
        .id;
    let base = format!("/v1/sandboxes/{id}/ports/{FAKE_HTTP_PORT}");

    let a = send(
        &app,
        req(Method::POST, &format!("{base}/a/b%20c?x=1&y=%2F"))
            .header("host", "node.example:7070")
            .header("authorization", "Bearer warren-token")
            .header("x-custom", "kept")
            .header("connection", "keep-alive, x-private")
            .header("x-private", "dropped")
            .body(Body::from("the body"))
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    assert_eq!(a.headers["warren-port"], "8000");
    assert!(
        a.headers.get("x-hop").is_none(),
        "the answer's hop-by-hop headers are dropped"
    );
    let seen = a.body.to_ascii_lowercase();
    assert!(
        seen.starts_with("post /a/b%20c?x=1&y=%2f http/1.1\r\n"),
        "{seen}"
    );
    assert!(seen.contains("\r\nhost: localhost:8000\r\n"), "{seen}");
    assert!(
        seen.contains("\r\nx-forwarded-host: node.example:7070\r\n"),
        "{seen}"
    );
    assert!(
        seen.contains(&format!(
            "\r\nx-forwarded-prefix: {}\r\n",
            base.to_ascii_lowercase()
        )),
        "{seen}"
    );
    assert!(seen.contains("\r\nx-custom: kept\r\n"), "{seen}");
    assert!(
        !seen.contains("authorization"),
        "Warren's token stays out: {seen}"
    );
    assert!(!seen.contains("x-private"), "{seen}");
    assert!(a.body.ends_with("\r\n\r\nthe body"), "{}", a.body);

    // An HTTP/2 request (the host in the URI's authority, no `Host`) reaches the server as
    // HTTP/1.1 with the caller's host forwarded.
    let a = send(
        &app,
        req(Method::GET, &format!("https://node.example:7443{base}/h2"))
            .version(axum::http::Version::HTTP_2)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let seen = a.body.to_ascii_lowercase();
    assert!(seen.starts_with("get /h2 http/1.1\r\n"), "{seen}");
    assert!(
        seen.contains("\r\nx-forwarded-host: node.example:7443\r\n"),
        "{seen}"
    );

    // The bare port and a trailing slash are the server's root; every method passes.
    for (method, uri) in [
        (Method::GET, base.clone()),
        (Method::GET, format!("{base}/")),
        (Method::DELETE, format!("{base}/x")),
        (Method::PUT, format!("{base}/x")),
        (Method::PATCH, format!("{base}/x")),
        (Method::OPTIONS, format!("{base}/x")),
        (Method::HEAD, format!("{base}/x")),
    ] {
        let a = send(&app, req(method.clone(), &uri).body(Body::empty()).unwrap()).await;
        assert_eq!(a.status, StatusCode::OK, "{method} {uri}: {}", a.body);
        if method == Method::HEAD {
            assert!(a.body.is_empty());
        } else {
            let path = if uri.ends_with("/x") { "/x" } else { "/" };
            assert!(
                a.body.starts_with(&format!("{method} {path} HTTP/1.1\r\n")),
                "{method} {uri}: {}",
                a.body
            );
        }
    }

    // Warren's own refusals: JSON errors without the port header.
    let cases = [
        (
            format!("/v1/sandboxes/{id}/ports/8001/"),
            502,
            ErrorCode::PortUnreachable,
        ),
        (
            format!("/v1/sandboxes/{id}/ports/0/"),
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            format!("/v1/sandboxes/{id}/ports/65536"),
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            format!("/v1/sandboxes/{id}/ports/web/x"),
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            "/v1/sandboxes/bad/ports/8000/".to_string(),
            400,
            ErrorCode::InvalidRequest,
        ),
        (
            "/v1/sandboxes/n1-01jd0m7x4e8k0k9yq1w2e3r4t5/ports/8000/".to_string(),
            404,
            ErrorCode::NotFound,
        ),
    ];
    for (uri, status, want) in cases {
        let a = send(&app, req(Method::GET, &uri).body(Body::empty()).unwrap()).await;
        assert_eq!(a.status.as_u16(), status, "{uri}: {}", a.body);
        assert_eq!(code(&a), want, "{uri}");
        assert!(a.headers.get("warren-port").is_none(), "{uri}");
    }
    let a = send(
        &app,
        req(Method::GET, &format!("/v1/sandboxes/{id}/ports/8001/"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(
        a.body.contains("nothing listens on port 8001"),
        "{}",
        a.body
    );

    // Another tenant's sandbox is not found, like a missing one.
    let stranger = Caller::tenant("b", Role::User, Quotas::default());
    let mut r = req(Method::GET, &format!("{base}/"))
        .body(Body::empty())
        .unwrap();
    r.extensions_mut().insert(stranger);
    let owned = m
        .create_as(
            &Caller::tenant("a", Role::User, Quotas::default()),
            CreateSandboxRequest::default(),
        )
        .await
        .unwrap()
        .info
        .id;
    *r.uri_mut() = format!("/v1/sandboxes/{owned}/ports/{FAKE_HTTP_PORT}/")
        .parse()
        .unwrap();
    let a = send(&app, r).await;
    assert_eq!(
        (a.status, code(&a)),
        (StatusCode::NOT_FOUND, ErrorCode::NotFound)
    );
}

#[tokio::test]
async fn an_upgrade_is_spliced_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (m, _) = manager_in(dir.path(), |_| {});
    let app = super::router(crate::Node::new(m.clone(), None));
    let id = m
        .create(CreateSandboxRequest::default())
        .await
        .unwrap()
        .info
        .id;
    // A real HTTP connection: the upgrade needs hyper's server on the other side.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /v1/sandboxes/{id}/ports/{FAKE_HTTP_PORT}/upgrade HTTP/1.1\r\nHost: x\r\n\
         Connection: Upgrade\r\nUpgrade: echo\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: echo"), "{head}");
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping");
}
