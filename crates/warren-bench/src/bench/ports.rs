//! `warren-bench ports`: what reaching a server inside a sandbox through
//! `/v1/sandboxes/{id}/ports/{port}/...` costs.
//!
//! One container sandbox runs `python3 -m http.server` on its loopback serving a 6-byte file.
//! Alternating, same sandbox, same client: a `GET` of the file through the route (the answer
//! read whole) and an `exec cat` of the same file (the direct way without a server). The GET
//! pays the route's connect into the sandbox's namespace, one HTTP/1.1 exchange with the
//! server (Python's, which dominates) and the node's forwarding; the exec pays the agent's
//! process start. Reported side by side, with the difference of the p50s.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use hyper::{HeaderMap, Method};
use serde::Serialize;
use warren_client::ExecRequest;

use super::measure::Setup;
use crate::stats::Latency;

const PORT: u16 = 8000;

/// What the ports bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct PortsBench {
    /// `GET /file` through the ports route.
    pub get: Latency,
    /// `exec cat /file`, same sandbox.
    pub exec: Latency,
    /// `get.p50_ms - exec.p50_ms`.
    pub extra_p50_ms: f64,
}

impl PortsBench {
    pub fn render(&self) -> String {
        format!(
            "ports: GET through /ports/{PORT} p50 {:.2} ms (p99 {:.2}) vs exec cat p50 {:.2} ms \
             (p99 {:.2}), {} samples each: {:+.2} ms\n",
            self.get.p50_ms,
            self.get.p99_ms,
            self.exec.p50_ms,
            self.exec.p99_ms,
            self.get.n,
            self.extra_p50_ms
        )
    }
}

async fn get(s: &Setup, id: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let answer = s
        .client
        .port_request(id, PORT, Method::GET, "/f", &HeaderMap::new(), Bytes::new())
        .await
        .context("GET through the ports route")?;
    let body = answer.body.collect_bytes().await?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        answer.status == 200 && &body[..] == b"hello\n",
        "unexpected answer {}: {body:?}",
        answer.status
    );
    Ok(ms)
}

async fn exec(s: &Setup, id: &str) -> anyhow::Result<f64> {
    let t = Instant::now();
    let r = s
        .client
        .exec(id, &ExecRequest::argv(["cat", "/srv/f"]))
        .await
        .context("exec cat")?;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(r.success() && r.stdout == "hello\n", "cat failed: {r:?}");
    Ok(ms)
}

/// `n` samples of each, alternating, after 20 warm-up pairs.
pub async fn ports(s: &Setup, n: usize) -> anyhow::Result<PortsBench> {
    s.note(format!(
        "ports: {n} GETs through the ports route and {n} exec cat, alternating"
    ));
    let sb = s
        .client
        .create(&s.request("ports"))
        .await
        .context("create")?;
    let id = sb.id.clone();
    let measured = async {
        s.client
            .exec(
                &id,
                &ExecRequest::shell("mkdir -p /srv && echo hello > /srv/f"),
            )
            .await?;
        s.client
            .spawn(
                &id,
                &ExecRequest::shell(
                    "python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv",
                ),
            )
            .await
            .context("starting the server")?;
        let started = Instant::now();
        while get(s, &id).await.is_err() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the server did not answer within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for _ in 0..20 {
            s.stop.check()?;
            get(s, &id).await?;
            exec(s, &id).await?;
        }
        let (mut g, mut e) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            s.stop.check()?;
            if i % 2 == 0 {
                g.push(get(s, &id).await?);
                e.push(exec(s, &id).await?);
            } else {
                e.push(exec(s, &id).await?);
                g.push(get(s, &id).await?);
            }
        }
        let (get, exec) = (Latency::from_samples(g), Latency::from_samples(e));
        Ok(PortsBench {
            extra_p50_ms: get.p50_ms - exec.p50_ms,
            get,
            exec,
        })
    }
    .await;
    let deleted = s.client.delete(&id).await;
    let r = measured?;
    deleted.with_context(|| format!("delete {id}"))?;
    Ok(r)
}
