//! Measurements of the gateway (`warren-gateway bench ...`, and `warren bench cluster`):
//!
//! - [`exec_overhead`]: `exec true` in one sandbox, through a gateway and straight to its
//!   node, interleaved, over kept-alive connections: p50 of each and the difference;
//! - [`loss_detection`]: after a node was killed, how long until every gateway shows it
//!   `lost`, and how long a call to one of its sandboxes takes to fail meanwhile.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{what} did not happen within {secs} s")]
    Timeout { what: String, secs: u64 },
}

/// Result of [`exec_overhead`], microseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Overhead {
    pub calls: usize,
    pub direct_p50_us: f64,
    pub gateway_p50_us: f64,
    pub overhead_p50_us: f64,
    pub direct_p99_us: f64,
    pub gateway_p99_us: f64,
}

/// Result of [`loss_detection`], milliseconds from the kill.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LossDetection {
    /// Per gateway, when it first showed the node `lost`.
    pub noticed_ms: Vec<f64>,
    /// The slowest of them.
    pub all_noticed_ms: f64,
    /// Calls to a sandbox of the node while it was not yet lost: the slowest to fail.
    pub call_fail_max_ms: f64,
    /// Their statuses, in order (503 then 410).
    pub call_statuses: Vec<u16>,
}

fn client() -> Client<HttpConnector, Body> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(http)
}

async fn call(
    c: &Client<HttpConnector, Body>,
    method: Method,
    url: &str,
    body: &'static str,
) -> Result<(StatusCode, bytes::Bytes), BenchError> {
    let err = |m: String| BenchError::Http {
        url: url.to_string(),
        message: m,
    };
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .map_err(|e| err(e.to_string()))?;
    let resp = c.request(req).await.map_err(|e| err(e.to_string()))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| err(e.to_string()))?
        .to_bytes();
    Ok((status, body))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    v[i]
}

/// `exec true` in sandbox `id`, `n` times through `gateway` and `n` times straight to `node`
/// (both `http://host:port`), alternating so both see the same machine load.
pub async fn exec_overhead(
    node: &str,
    gateway: &str,
    id: &str,
    n: usize,
) -> Result<Overhead, BenchError> {
    let c = client();
    let body = r#"{"argv":["true"]}"#;
    let direct_url = format!("{node}/v1/sandboxes/{id}/exec");
    let gw_url = format!("{gateway}/v1/sandboxes/{id}/exec");
    // Warm the connections and the sandbox.
    for _ in 0..10 {
        for u in [&direct_url, &gw_url] {
            let (s, b) = call(&c, Method::POST, u, body).await?;
            if !s.is_success() {
                return Err(BenchError::Http {
                    url: u.clone(),
                    message: format!("{s}: {}", String::from_utf8_lossy(&b)),
                });
            }
        }
    }
    let (mut direct, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let order = if i % 2 == 0 {
            [(&direct_url, 0), (&gw_url, 1)]
        } else {
            [(&gw_url, 1), (&direct_url, 0)]
        };
        for (u, which) in order {
            let t = Instant::now();
            let (s, _) = call(&c, Method::POST, u, body).await?;
            let us = t.elapsed().as_secs_f64() * 1e6;
            if !s.is_success() {
                return Err(BenchError::Http {
                    url: u.clone(),
                    message: s.to_string(),
                });
            }
            if which == 0 {
                direct.push(us);
            } else {
                via.push(us);
            }
        }
    }
    let d50 = percentile(&mut direct, 0.5);
    let g50 = percentile(&mut via, 0.5);
    Ok(Overhead {
        calls: n,
        direct_p50_us: d50,
        gateway_p50_us: g50,
        overhead_p50_us: g50 - d50,
        direct_p99_us: percentile(&mut direct, 0.99),
        gateway_p99_us: percentile(&mut via, 0.99),
    })
}

/// Call right after a node `node` (owner of sandbox `id`) was killed at `killed`: polls every
/// gateway's `/v1/cluster` until each shows the node lost, calling `GET /v1/sandboxes/{id}`
/// through the first gateway meanwhile, for at most `limit`.
pub async fn loss_detection(
    gateways: &[String],
    node: &str,
    id: &str,
    killed: Instant,
    limit: Duration,
) -> Result<LossDetection, BenchError> {
    let c = client();
    let mut noticed: Vec<Option<f64>> = vec![None; gateways.len()];
    let mut call_fail_max_ms: f64 = 0.0;
    let mut statuses: Vec<u16> = Vec::new();
    while noticed.iter().any(|n| n.is_none()) {
        if killed.elapsed() > limit {
            return Err(BenchError::Timeout {
                what: format!("every gateway noticing node {node} lost"),
                secs: limit.as_secs(),
            });
        }
        for (i, g) in gateways.iter().enumerate() {
            if noticed[i].is_some() {
                continue;
            }
            let (_, body) = call(&c, Method::GET, &format!("{g}/v1/cluster"), "").await?;
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let lost = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|n| n["id"] == node && n["state"] == "lost");
            if lost {
                noticed[i] = Some(killed.elapsed().as_secs_f64() * 1e3);
            }
        }
        let t = Instant::now();
        let (s, _) = call(
            &c,
            Method::GET,
            &format!("{}/v1/sandboxes/{id}", gateways[0]),
            "",
        )
        .await?;
        call_fail_max_ms = call_fail_max_ms.max(t.elapsed().as_secs_f64() * 1e3);
        if statuses.last() != Some(&s.as_u16()) {
            statuses.push(s.as_u16());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let noticed_ms: Vec<f64> = noticed.into_iter().map(|n| n.unwrap_or(0.0)).collect();
    Ok(LossDetection {
        all_noticed_ms: noticed_ms.iter().cloned().fold(0.0, f64::max),
        noticed_ms,
        call_fail_max_ms,
        call_statuses: statuses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 1.0), 5.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
