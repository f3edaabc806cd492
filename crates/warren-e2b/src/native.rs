//! Calls into Warren's v1 API in-process: a request built here goes through the node's (or the
//! gateway's) router exactly like one from the network, minus the edge's authentication,
//! which the E2B front did itself. The request carries the [`Caller`] in its extensions (a
//! node's extractors read it) and the API key as a bearer token (a gateway passes the
//! caller's headers on to the node, which authenticates them again). So every call is
//! authorized, limited, counted and logged in the trajectory like a native one.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tower::ServiceExt;
use warren_types::Caller;

use crate::error::{E2bError, E2bResult};

/// Who an E2B request acts as.
#[derive(Debug, Clone)]
pub struct Principal {
    pub caller: Caller,
    /// The API key it presented (`X-API-Key`), passed on as `Authorization: Bearer`.
    pub key: Option<String>,
}

impl Principal {
    /// Puts the caller and the key into `req`.
    pub fn stamp(&self, req: &mut Request) {
        req.extensions_mut().insert(self.caller.clone());
        if let Some(key) = &self.key {
            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                req.headers_mut().insert(header::AUTHORIZATION, v);
            }
        }
    }
}

/// Warren's v1 API as a service.
#[derive(Clone)]
pub struct Native {
    router: Router,
}

impl std::fmt::Debug for Native {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Native { .. }")
    }
}

impl Native {
    pub fn new(router: Router) -> Native {
        Native { router }
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Serves `req` as `who`.
    pub async fn serve(&self, who: &Principal, mut req: Request) -> Response {
        who.stamp(&mut req);
        // The router's error type is Infallible.
        match self.router.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// Sends one JSON call (no body when `body` is `None`) and reads the whole answer.
    pub async fn send(
        &self,
        who: &Principal,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> E2bResult<(StatusCode, bytes::Bytes)> {
        let mut b = Request::builder().method(method).uri(path);
        let body = match body {
            Some(v) => {
                b = b.header(header::CONTENT_TYPE, "application/json");
                Body::from(serde_json::to_vec(&v).map_err(|e| E2bError::Internal(e.to_string()))?)
            }
            None => Body::empty(),
        };
        let req = b
            .body(body)
            .map_err(|e| E2bError::BadRequest(format!("cannot build a call to {path}: {e}")))?;
        let resp = self.serve(who, req).await;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| E2bError::Internal(format!("reading the answer of {path}: {e}")))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// A call whose success answers JSON of type `T`; an error answer becomes an
    /// [`E2bError::Native`].
    pub async fn call<T: DeserializeOwned>(
        &self,
        who: &Principal,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> E2bResult<(StatusCode, T)> {
        let body = body
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| E2bError::Internal(e.to_string()))?;
        let (status, bytes) = self.send(who, method, path, body).await?;
        if !status.is_success() {
            return Err(E2bError::from_native(status, &bytes));
        }
        let v = serde_json::from_slice(&bytes)
            .map_err(|e| E2bError::Internal(format!("the answer of {path} does not parse: {e}")))?;
        Ok((status, v))
    }

    /// A call whose success answer is not read.
    pub async fn call_unit(
        &self,
        who: &Principal,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> E2bResult<StatusCode> {
        let (status, bytes) = self.send(who, method, path, body).await?;
        if !status.is_success() {
            return Err(E2bError::from_native(status, &bytes));
        }
        Ok(status)
    }
}
