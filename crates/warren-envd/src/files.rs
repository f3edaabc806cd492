//! envd's plain HTTP routes: `GET /files` (download), `POST /files` (upload: a raw body with
//! `?path=`, or `multipart/form-data` whose parts' file names are the paths), `/health`.
//! Errors answer envd's shape, `{"code": <HTTP status>, "message": ...}`.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;

use crate::connect::{Code, ConnectError};
use crate::filesystem::resolve_path;
use crate::users::Users;
use crate::v1::{enc, Sandbox};

/// envd's error answer for a Connect-coded error.
pub fn http_error(e: &ConnectError) -> Response {
    let status = match e.code {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::BAD_GATEWAY,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = serde_json::json!({ "code": status.as_u16(), "message": e.message });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The query's `path` and `username` (percent-decoded); other parameters (the signature of a
/// signed URL, checked by the front) are ignored.
fn query(uri: &axum::http::Uri) -> (Option<String>, Option<String>) {
    let (mut path, mut user) = (None, None);
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*k {
            "path" => path = Some(v.into_owned()),
            "username" => user = Some(v.into_owned()),
            _ => {}
        }
    }
    (path, user)
}

pub async fn download(sb: &Sandbox, user: Option<String>, req: Request) -> Response {
    let (path, q_user) = query(req.uri());
    let user = q_user.or(user);
    let r = async {
        let path = path.ok_or_else(|| ConnectError::invalid("the query names no path"))?;
        let path = resolve_path(&path, user.as_deref())?;
        sb.call(
            Method::GET,
            &format!("/files?path={}", enc(&path)),
            None,
            Body::empty(),
        )
        .await
    }
    .await;
    match r {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            parts.headers.insert(
                header::CONTENT_TYPE,
                "application/octet-stream".parse().unwrap_or_else(|_| {
                    header::HeaderValue::from_static("application/octet-stream")
                }),
            );
            Response::from_parts(parts, body)
        }
        Err(e) => http_error(&e),
    }
}

pub async fn upload(sb: &Sandbox, users: &Users, user: Option<String>, req: Request) -> Response {
    let (path, q_user) = query(req.uri());
    let user = q_user.or(user);
    match upload_inner(sb, users, user, path, req).await {
        Ok(written) => {
            let list: Vec<_> = written
                .iter()
                .map(|p| {
                    serde_json::json!({
                        "name": p.rsplit('/').next().unwrap_or(""),
                        "type": "file",
                        "path": p,
                    })
                })
                .collect();
            (StatusCode::OK, axum::Json(list)).into_response()
        }
        Err(e) => http_error(&e),
    }
}

async fn upload_inner(
    sb: &Sandbox,
    users: &Users,
    user: Option<String>,
    path: Option<String>,
    req: Request,
) -> Result<Vec<String>, ConnectError> {
    let headers = req.headers().clone();
    match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => {}
        Some(other) => {
            return Err(ConnectError::invalid(format!(
            "uploads in Content-Encoding {other:?} are not supported; send the bytes as they are"
        )))
        }
    }
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_string();
    let owner = users.resolve(sb, user.as_deref()).await?;
    if ct.starts_with("multipart/form-data") {
        let boundary = multer::parse_boundary(&ct)
            .map_err(|e| ConnectError::invalid(format!("multipart body: {e}")))?;
        let mut mp = multer::Multipart::new(req.into_body().into_data_stream(), boundary);
        let mut written = Vec::new();
        let mut first = true;
        while let Some(field) = mp
            .next_field()
            .await
            .map_err(|e| ConnectError::invalid(format!("multipart body: {e}")))?
        {
            // The query's path names a single file; otherwise each part's file name is its path.
            let name = match (&path, first) {
                (Some(p), true) => p.clone(),
                _ => field.file_name().map(str::to_string).ok_or_else(|| {
                    ConnectError::invalid("a multipart part has no file name (its path)")
                })?,
            };
            first = false;
            let dest = resolve_path(&name, user.as_deref())?;
            let body = Body::from_stream(field.map(|c| c.map_err(std::io::Error::other)));
            put(sb, &dest, None, body, owner.as_deref()).await?;
            written.push(dest);
        }
        if written.is_empty() {
            return Err(ConnectError::invalid("the multipart body holds no file"));
        }
        Ok(written)
    } else {
        let path =
            path.ok_or_else(|| ConnectError::invalid("an upload of raw bytes needs ?path="))?;
        let dest = resolve_path(&path, user.as_deref())?;
        let len = content_length(&headers);
        put(sb, &dest, len, req.into_body(), owner.as_deref()).await?;
        Ok(vec![dest])
    }
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Writes `body` to `dest`, making its parents first; a named user other than root then owns it.
async fn put(
    sb: &Sandbox,
    dest: &str,
    len: Option<u64>,
    body: Body,
    owner: Option<&str>,
) -> Result<(), ConnectError> {
    if let Some((parent, _)) = dest.rsplit_once('/') {
        if !parent.is_empty() {
            let mk = warren_types::MkdirRequest {
                path: parent.to_string(),
                parents: true,
                mode: None,
            };
            sb.json_call(Method::POST, "/files/mkdir", Some(&mk))
                .await?;
        }
    }
    let mut uri = format!("/files?path={}", enc(dest));
    if let Some(n) = len {
        uri.push_str(&format!("&size={n}"));
    }
    sb.call(Method::PUT, &uri, Some("application/octet-stream"), body)
        .await?;
    if let Some(u) = owner.filter(|u| *u != "0" && *u != "root") {
        chown(sb, u, dest).await?;
    }
    Ok(())
}

/// Gives `path` to `user` (files are written by the sandbox's root).
pub async fn chown(sb: &Sandbox, user: &str, path: &str) -> Result<(), ConnectError> {
    let exec = warren_types::ExecRequest {
        argv: Some(vec![
            "chown".into(),
            format!("{user}:"),
            "--".into(),
            path.to_string(),
        ]),
        user: Some("0".into()),
        ..Default::default()
    };
    let r: warren_types::ExecResult = sb.json(Method::POST, "/exec", Some(&exec)).await?;
    if r.exit_code != Some(0) {
        return Err(ConnectError::internal(format!(
            "chown {user} {path}: {}",
            r.stderr.trim()
        )));
    }
    Ok(())
}
