//! Listings: `GET /sandboxes` (every running sandbox) and `GET /v2/sandboxes` (filters on
//! metadata, state, template and start time; pages by `limit` and `nextToken`, answered in
//! the `x-next-token` header; `order` by start time over the whole result).
//!
//! The v1 listing does the tenant scoping and the label filter (on a gateway it fans out to
//! every node); the rest is filtered here. The page token is the id of the page's last
//! sandbox: ids sort by creation time (ULID), then node.

use std::collections::BTreeMap;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use warren_types::{SandboxId, SandboxInfo};

use crate::convert;
use crate::error::{E2bError, E2bResult};
use crate::native::Principal;
use crate::{wire, E2b};

/// Most sandboxes in one page.
pub const MAX_LIMIT: usize = 1000;
/// Page size when the request names none.
pub const DEFAULT_LIMIT: usize = 100;

/// The query's pairs, the last of a repeated name winning.
pub fn pairs(q: Option<&str>) -> BTreeMap<String, String> {
    form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// E2B's `metadata` filter: `k=v&k2=v2`, each key and value percent-encoded once more.
pub fn metadata_filter(s: &str) -> E2bResult<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(s.as_bytes()) {
        let dec = |x: &str| {
            percent_encoding::percent_decode_str(x)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| E2bError::BadRequest("metadata filter is not UTF-8".into()))
        };
        let (k, v) = (dec(&k)?, dec(&v)?);
        if k.is_empty() {
            return Err(E2bError::BadRequest(
                "metadata filter must be key=value pairs".into(),
            ));
        }
        out.insert(k, v);
    }
    Ok(out)
}

/// What a listing asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub metadata: BTreeMap<String, String>,
    /// E2B states wanted (`running`, `paused`); empty is both.
    pub states: Vec<String>,
    pub template: Option<String>,
    pub started_after_ms: Option<u64>,
    pub descending: bool,
    pub limit: usize,
    pub after: Option<SandboxId>,
}

impl Query {
    pub fn parse(q: Option<&str>) -> E2bResult<Query> {
        let p = pairs(q);
        let metadata = match p.get("metadata") {
            Some(m) => metadata_filter(m)?,
            None => BTreeMap::new(),
        };
        let mut states = Vec::new();
        if let Some(s) = p.get("state") {
            for s in s.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if s != "running" && s != "paused" {
                    return Err(E2bError::BadRequest(format!(
                        "state must be running or paused, got {s:?}"
                    )));
                }
                states.push(s.to_string());
            }
        }
        let started_after_ms = p
            .get("startedAfter")
            .map(|s| {
                chrono::DateTime::parse_from_rfc3339(s)
                    .map(|t| t.timestamp_millis().max(0) as u64)
                    .map_err(|e| {
                        E2bError::BadRequest(format!("startedAfter is not RFC 3339 ({e}): {s:?}"))
                    })
            })
            .transpose()?;
        let descending = match p.get("order").map(String::as_str) {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(o) => {
                return Err(E2bError::BadRequest(format!(
                    "order must be asc or desc, got {o:?}"
                )))
            }
        };
        let limit = match p.get("limit") {
            None => DEFAULT_LIMIT,
            Some(l) => match l.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                _ => {
                    return Err(E2bError::BadRequest(format!(
                        "limit must be 1 to {MAX_LIMIT}, got {l:?}"
                    )))
                }
            },
        };
        let after = p
            .get("nextToken")
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<SandboxId>()
                    .map_err(|_| E2bError::BadRequest(format!("nextToken {t:?} is not valid")))
            })
            .transpose()?;
        Ok(Query {
            metadata,
            states,
            template: p.get("template").cloned(),
            started_after_ms,
            descending,
            limit,
            after,
        })
    }

    /// The v1 listing's query: the label filter.
    fn native_path(&self) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.metadata {
            s.append_pair("label", &format!("{k}={v}"));
        }
        let q = s.finish();
        if q.is_empty() {
            "/v1/sandboxes".into()
        } else {
            format!("/v1/sandboxes?{q}")
        }
    }

    fn wants(&self, info: &SandboxInfo, sb: &wire::ListedSandbox) -> bool {
        (self.states.is_empty() || self.states.contains(&sb.state))
            && self
                .template
                .as_ref()
                .is_none_or(|t| *t == sb.template_id || info.image.contains(t))
            && self
                .started_after_ms
                .is_none_or(|t| info.created_at_ms >= t)
    }

    /// Filters, orders and cuts `all` to one page; answers the page and the next token.
    pub fn page(
        &self,
        all: Vec<SandboxInfo>,
        envd_version: &str,
    ) -> (Vec<wire::ListedSandbox>, Option<String>) {
        let mut rows: Vec<(SandboxId, wire::ListedSandbox)> = all
            .iter()
            .filter_map(|info| {
                let id = info.id.parse::<SandboxId>().ok()?;
                let sb = convert::listed(info, envd_version)?;
                self.wants(info, &sb).then_some((id, sb))
            })
            .collect();
        rows.sort_by(|a, b| a.0.order_key().cmp(&b.0.order_key()));
        if self.descending {
            rows.reverse();
        }
        if let Some(after) = &self.after {
            let key = after.order_key();
            rows.retain(|(id, _)| {
                if self.descending {
                    id.order_key() < key
                } else {
                    id.order_key() > key
                }
            });
        }
        let next = (rows.len() > self.limit).then(|| rows[self.limit - 1].0.to_string());
        rows.truncate(self.limit);
        (rows.into_iter().map(|(_, sb)| sb).collect(), next)
    }
}

#[derive(Deserialize)]
struct SandboxList {
    sandboxes: Vec<SandboxInfo>,
}

async fn fetch(e2b: &E2b, who: &Principal, q: &Query) -> E2bResult<Vec<SandboxInfo>> {
    let (_, list): (_, SandboxList) = e2b
        .native()
        .call(who, Method::GET, &q.native_path(), None::<&()>)
        .await?;
    Ok(list.sandboxes)
}

/// `GET /v2/sandboxes`.
pub async fn list_v2(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    RawQuery(q): RawQuery,
) -> E2bResult<Response> {
    let q = Query::parse(q.as_deref())?;
    let all = fetch(&e2b, &who, &q).await?;
    let (page, next) = q.page(all, e2b.envd_version());
    let mut resp = Json(page).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", next);
    }
    Ok(resp)
}

/// `GET /sandboxes`: every running sandbox matching the metadata filter, one page.
pub async fn list_v1(
    State(e2b): State<E2b>,
    Extension(who): Extension<Principal>,
    RawQuery(q): RawQuery,
) -> E2bResult<Json<Vec<wire::ListedSandbox>>> {
    let p = pairs(q.as_deref());
    let q = Query {
        metadata: match p.get("metadata") {
            Some(m) => metadata_filter(m)?,
            None => BTreeMap::new(),
        },
        states: vec!["running".into()],
        template: None,
        started_after_ms: None,
        descending: false,
        limit: usize::MAX,
        after: None,
    };
    let all = fetch(&e2b, &who, &q).await?;
    Ok(Json(q.page(all, e2b.envd_version()).0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_as_the_sdk_encodes_it() {
        // The SDK quotes keys and values, urlencodes the pairs, and the HTTP client encodes
        // the whole as one query value.
        let inner = "run%20id=a%2Fb&k=v";
        let q = form_urlencoded::Serializer::new(String::new())
            .append_pair("metadata", inner)
            .append_pair("state", "running,paused")
            .append_pair("limit", "2")
            .finish();
        let parsed = Query::parse(Some(&q)).unwrap();
        let mut want = BTreeMap::new();
        want.insert("run id".to_string(), "a/b".to_string());
        want.insert("k".to_string(), "v".to_string());
        assert_eq!(parsed.metadata, want);
        assert_eq!(parsed.states, ["running", "paused"]);
        assert_eq!(parsed.limit, 2);
    }

    #[test]
    fn bad_queries_are_400() {
        for q in [
            "state=stopped",
            "limit=0",
            "limit=x",
            "order=up",
            "startedAfter=yesterday",
            "nextToken=../x",
        ] {
            assert!(
                matches!(Query::parse(Some(q)), Err(E2bError::BadRequest(_))),
                "{q}"
            );
        }
        let q = Query::parse(Some("startedAfter=2026-01-01T01:00:00%2B01:00")).unwrap();
        assert_eq!(q.started_after_ms, Some(1_767_225_600_000));
    }
}
