//! Request parsing at the edge: JSON bodies, path parameters and query strings, each refused
//! with a JSON `invalid_request` answer (never axum's plain-text rejections).

use axum::body::Body;
use axum::extract::{FromRef, FromRequest, FromRequestParts, RawPathParams, Request};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use warren_types::{Caller, SandboxId};

use super::error::HttpError;
use crate::manager::Manager;

/// Largest JSON request body (inline stdin can be 16 MiB, JSON-escaped).
pub const MAX_JSON_BODY: usize = 32 << 20;

/// JSON bodies must say they are JSON, or say nothing. `application/x-www-form-urlencoded`
/// is let through because it is what `curl -d` sends by default; the bytes must still be
/// JSON.
pub(crate) fn check_content_type(headers: &HeaderMap) -> Result<(), HttpError> {
    let Some(ct) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct
        .to_str()
        .map_err(|_| HttpError::invalid("unreadable Content-Type"))?;
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let ok = essence == "application/json"
        || essence.ends_with("+json")
        || essence == "application/x-www-form-urlencoded";
    if ok {
        Ok(())
    } else {
        Err(HttpError::invalid(format!(
            "Content-Type must be application/json, got {ct:?}"
        )))
    }
}

async fn read_body(req: Request) -> Result<axum::body::Bytes, HttpError> {
    check_content_type(req.headers())?;
    axum::body::to_bytes(req.into_body(), MAX_JSON_BODY)
        .await
        .map_err(|e| {
            HttpError::invalid(format!(
                "cannot read the body (at most {MAX_JSON_BODY} bytes): {e}"
            ))
        })
}

pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, HttpError> {
    // Every request body is a JSON object. serde would also accept a struct written as an
    // array (`[]` would be a create with all defaults), so the top level is checked first.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(HttpError::invalid("the JSON body must be an object"));
    }
    serde_json::from_slice(bytes).map_err(|e| HttpError::invalid(format!("bad JSON body: {e}")))
}

/// A required JSON body.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, HttpError> {
        let bytes = read_body(req).await?;
        if bytes.is_empty() {
            return Err(HttpError::invalid("a JSON body is required"));
        }
        parse_json(&bytes).map(JsonBody)
    }
}

/// A JSON body that may be left out (then `T::default()`).
#[derive(Debug)]
pub struct OptionalJsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = HttpError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, HttpError> {
        let bytes = read_body(req).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJsonBody(T::default()));
        }
        parse_json(&bytes).map(OptionalJsonBody)
    }
}

/// A raw body (file uploads): streamed, no size limit.
pub type RawBody = Body;

/// The body of an upload that must hold something (a tar archive, an image, a build
/// context): waits for its first bytes and refuses a body that ends before any with a 400,
/// before anything is unpacked, imported or built; the bytes read go on in front of the rest.
pub async fn non_empty(
    body: RawBody,
    what: &str,
) -> Result<impl futures::Stream<Item = Result<bytes::Bytes, axum::Error>> + Send + Unpin, HttpError>
{
    use futures::StreamExt as _;
    let mut rest = body.into_data_stream();
    loop {
        match rest.next().await {
            None => {
                return Err(HttpError::invalid(format!(
                    "the request has no body: {what} is expected"
                )))
            }
            Some(Ok(b)) if b.is_empty() => continue,
            Some(first) => return Ok(futures::stream::once(std::future::ready(first)).chain(rest)),
        }
    }
}

async fn path_params(parts: &mut Parts) -> Result<Vec<(String, String)>, HttpError> {
    // Raw params fail only on bad percent-encoding; the values are checked by the caller.
    let raw = RawPathParams::from_request_parts(parts, &())
        .await
        .map_err(|e| HttpError::invalid(format!("bad path: {e}")))?;
    Ok(raw
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

fn param(params: &[(String, String)], name: &str) -> Result<String, HttpError> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .ok_or_else(|| HttpError::invalid(format!("missing path parameter {name}")))
}

pub(crate) fn sandbox_id(s: &str) -> Result<SandboxId, HttpError> {
    s.parse()
        .map_err(|e: warren_types::id::IdError| HttpError::invalid(e.to_string()))
}

/// A `{pid}` path parameter: a positive integer.
pub(crate) fn pid(s: &str) -> Result<u32, HttpError> {
    s.parse::<u32>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| HttpError::invalid(format!("pid must be a positive integer, got {s:?}")))
}

/// Who is calling: the [`Caller`] the edge's authentication put into the request, or the
/// node's administrator when nothing did (a node without `--auth`).
#[derive(Debug, Clone)]
pub struct Auth(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Auth {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        Ok(Auth(caller(parts)))
    }
}

fn caller(parts: &Parts) -> Caller {
    parts
        .extensions
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::admin)
}

/// `{id}` of `/v1/sandboxes/{id}/...`, parsed, of a sandbox the caller may see: another
/// tenant's sandbox is refused here, exactly like a missing one, for every route.
#[derive(Debug)]
pub struct SandboxParam(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for SandboxParam
where
    Manager: FromRef<S>,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let m = Manager::from_ref(state);
        let params = path_params(parts).await?;
        let id = sandbox_id(&param(&params, "id")?)?;
        m.authorize(&caller(parts), &id)?;
        Ok(SandboxParam(id))
    }
}

/// `{id}` of `/v1/sandboxes/{id}/...`, parsed only: the handler decides who may see what
/// (a route that answers for sandboxes that are no longer on the node).
#[derive(Debug)]
pub struct RawSandboxParam(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for RawSandboxParam {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        let params = path_params(parts).await?;
        Ok(RawSandboxParam(sandbox_id(&param(&params, "id")?)?))
    }
}

/// `{id}` and `{pid}` of `/v1/sandboxes/{id}/processes/{pid}/...`, parsed.
#[derive(Debug)]
pub struct ProcessParam(pub SandboxId, pub u32);

impl<S: Send + Sync> FromRequestParts<S> for ProcessParam
where
    Manager: FromRef<S>,
{
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let m = Manager::from_ref(state);
        let params = path_params(parts).await?;
        let id = sandbox_id(&param(&params, "id")?)?;
        m.authorize(&caller(parts), &id)?;
        let pid = pid(&param(&params, "pid")?)?;
        Ok(ProcessParam(id, pid))
    }
}

/// The query string as decoded pairs, in order (repeated keys kept).
#[derive(Debug, Default)]
pub struct QueryPairs(pub Vec<(String, String)>);

impl<S: Send + Sync> FromRequestParts<S> for QueryPairs {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        Ok(QueryPairs::from_query(
            parts.uri.query().unwrap_or("").as_bytes(),
        ))
    }
}

impl QueryPairs {
    /// Decodes a raw query string.
    pub fn from_query(q: &[u8]) -> Self {
        QueryPairs(
            form_urlencoded::parse(q)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// Refuses parameters other than `allowed` and repeats of single-valued ones.
    pub fn only(&self, allowed: &[&str], repeatable: &[&str]) -> Result<(), HttpError> {
        for (i, (k, _)) in self.0.iter().enumerate() {
            if !allowed.contains(&k.as_str()) {
                return Err(HttpError::invalid(format!(
                    "unknown query parameter {k:?} (expected one of {allowed:?})"
                )));
            }
            if !repeatable.contains(&k.as_str()) && self.0[..i].iter().any(|(p, _)| p == k) {
                return Err(HttpError::invalid(format!(
                    "query parameter {k:?} given twice"
                )));
            }
        }
        Ok(())
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn required(&self, key: &str) -> Result<&str, HttpError> {
        self.get(key)
            .ok_or_else(|| HttpError::invalid(format!("query parameter {key:?} is required")))
    }

    /// A parsed value, `None` when absent.
    pub fn parsed<T: std::str::FromStr>(
        &self,
        key: &str,
        what: &str,
    ) -> Result<Option<T>, HttpError> {
        self.get(key)
            .map(|v| {
                v.parse::<T>().map_err(|_| {
                    HttpError::invalid(format!("query parameter {key:?} must be {what}, got {v:?}"))
                })
            })
            .transpose()
    }

    /// A step index or sequence number (at most [`warren_types::validate::MAX_INDEX`]).
    pub fn index(&self, key: &str, what: &str) -> Result<Option<u64>, HttpError> {
        match self.parsed::<u64>(key, what)? {
            Some(v) => Ok(Some(warren_types::validate::index(key, v)?)),
            None => Ok(None),
        }
    }

    /// The `step` of a call whose route takes no other query parameter.
    pub fn only_step(&self) -> Result<Option<u64>, HttpError> {
        self.only(&["step"], &[])?;
        self.index("step", "a step number")
    }

    /// `true`/`false` (also `1`/`0`), `false` when absent.
    pub fn flag(&self, key: &str) -> Result<bool, HttpError> {
        match self.get(key) {
            None => Ok(false),
            Some("true" | "1") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(v) => Err(HttpError::invalid(format!(
                "query parameter {key:?} must be true or false, got {v:?}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        check_content_type(&h).unwrap();
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "application/x-www-form-urlencoded",
            "application/merge+json",
        ] {
            h.insert(CONTENT_TYPE, ok.parse().unwrap());
            check_content_type(&h).unwrap();
        }
        for bad in [
            "text/plain",
            "multipart/form-data; boundary=x",
            "application/octet-stream",
        ] {
            h.insert(CONTENT_TYPE, bad.parse().unwrap());
            assert!(check_content_type(&h).is_err(), "{bad}");
        }
    }

    #[test]
    fn query_rules() {
        let q = QueryPairs(vec![
            ("label".into(), "a=1".into()),
            ("label".into(), "b=2".into()),
            ("state".into(), "running".into()),
        ]);
        q.only(&["label", "state"], &["label"]).unwrap();
        assert_eq!(q.all("label").collect::<Vec<_>>(), ["a=1", "b=2"]);
        assert!(q.only(&["label"], &["label"]).is_err());
        let q = QueryPairs(vec![
            ("path".into(), "/a".into()),
            ("path".into(), "/b".into()),
        ]);
        assert!(q.only(&["path"], &[]).is_err());
        let q = QueryPairs(vec![
            ("mode".into(), "x".into()),
            ("recursive".into(), "yes".into()),
        ]);
        assert!(q.parsed::<u32>("mode", "a number").is_err());
        assert!(q.flag("recursive").is_err());
        assert!(!q.flag("other").unwrap());
    }
}
