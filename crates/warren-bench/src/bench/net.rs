//! `warren-bench net`: what a network policy costs at create.
//!
//! Create → first `exec true` finished, alternating a sandbox with policy `none` and one with
//! an allow-list policy (two CIDR rules and a domain: a veth link, its nftables chain and sets,
//! and its resolver), so both series see the same host load. No packet is sent anywhere.
//! Target: allow-list p50 − none p50 ≤ 5 ms.

use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{CreateSandboxRequest, ExecRequest};
use warren_types::NetworkPolicy;

use super::measure::Setup;
use crate::stats::Latency;

/// What the net bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct NetBench {
    /// Policy `none`.
    pub none: Latency,
    /// The allow-list policy.
    pub allow: Latency,
    /// `allow.p50_ms - none.p50_ms`.
    pub extra_p50_ms: f64,
}

impl NetBench {
    pub fn render(&self) -> String {
        format!(
            "net: create -> first exec p50 {:.2} ms with an allow-list policy vs {:.2} ms with none \
             (p99 {:.2} / {:.2} ms, {} samples each): +{:.2} ms\n",
            self.allow.p50_ms,
            self.none.p50_ms,
            self.allow.p99_ms,
            self.none.p99_ms,
            self.none.n,
            self.extra_p50_ms
        )
    }
}

/// The allow-list policy of the bench: private ranges nobody answers on, and a domain.
pub fn allow_policy() -> NetworkPolicy {
    serde_json::from_value(serde_json::json!({
        "mode": "allow",
        "allow": [
            {"cidr": "10.254.250.0/24", "ports": 443, "protocol": "tcp"},
            {"cidr": "10.254.251.7", "ports": "8000-8100"}
        ],
        "domains": ["files.example.test"]
    }))
    .expect("the bench policy is valid")
}

async fn sample(s: &Setup, policy: &NetworkPolicy) -> anyhow::Result<f64> {
    let req = CreateSandboxRequest {
        network: policy.clone(),
        ..s.request("net")
    };
    let t = Instant::now();
    let sb = s.client.create(&req).await.context("create")?;
    let ran = s
        .client
        .exec(&sb.id, &ExecRequest::argv(["true"]))
        .await
        .context("exec true");
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    let deleted = s
        .client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id));
    anyhow::ensure!(ran?.success(), "`true` failed");
    deleted?;
    Ok(ms)
}

/// `n` samples of each policy, alternating, after 3 warm-up pairs.
pub async fn net(s: &Setup, n: usize) -> anyhow::Result<NetBench> {
    s.note(format!(
        "net: {n} creates with policy none and {n} with an allow list, alternating"
    ));
    let allow = allow_policy();
    let none = NetworkPolicy::none();
    for _ in 0..3 {
        s.stop.check()?;
        sample(s, &none).await?;
        sample(s, &allow)
            .await
            .context("a create with an allow-list policy")?;
    }
    let (mut a, mut b) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        s.stop.check()?;
        // Alternate which goes first, so neither always follows a delete of the other kind.
        if i % 2 == 0 {
            a.push(sample(s, &none).await?);
            b.push(sample(s, &allow).await?);
        } else {
            b.push(sample(s, &allow).await?);
            a.push(sample(s, &none).await?);
        }
    }
    let (none, allow) = (Latency::from_samples(a), Latency::from_samples(b));
    Ok(NetBench {
        extra_p50_ms: allow.p50_ms - none.p50_ms,
        none,
        allow,
    })
}
