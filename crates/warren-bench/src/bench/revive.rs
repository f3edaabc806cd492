//! `warren-bench revive`: revive of a SWE-style episode against the time its calls took.
//!
//! 1. Records an episode of `n` calls in a sandbox of the bench image, cycling through what a
//!    coding agent does: write a source file, run its tests with `python3`, commit with
//!    `git`, edit with `sed` and look with `grep`; each exec names a step.
//! 2. Revives the sandbox (`POST /v1/sandboxes/{id}/revive`) and times it end to end from
//!    the client (the new sandbox's creation included).
//! 3. Compares with the sum of the recorded durations of the episode's calls (what the
//!    revive report says it replayed, checked against the old trajectory).
//!
//! Target: revive ≤ 1.1 × the recorded sum. `git commit` ids depend on the time, so the
//! report's divergences are counted, not required to be zero.

use std::time::Instant;

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{ExecRequest, ImageRef};

use super::measure::Setup;

/// What the revive bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct ReviveBench {
    /// Calls in the episode.
    pub calls: usize,
    /// Recording the episode, wall time from the client.
    pub record_secs: f64,
    /// The sum of the recorded durations of the episode's calls.
    pub recorded_ms: f64,
    /// The revive, wall time from the client.
    pub revive_ms: f64,
    /// The revive as the node timed it.
    pub node_ms: f64,
    pub replayed: u64,
    pub divergences: u64,
    pub first_divergence_step: Option<u64>,
}

impl ReviveBench {
    pub fn ratio(&self) -> f64 {
        self.revive_ms / self.recorded_ms.max(1e-9)
    }

    /// The human-readable line.
    pub fn render(&self) -> String {
        format!(
            "revive: {} calls recorded in {:.2} s; sum of recorded durations {:.0} ms; \
             revive {:.0} ms from the client ({:.0} ms on the node) = {:.3}x; \
             {} replayed, {} divergences (first at step {})\n",
            self.calls,
            self.record_secs,
            self.recorded_ms,
            self.revive_ms,
            self.node_ms,
            self.ratio(),
            self.replayed,
            self.divergences,
            self.first_divergence_step
                .map_or_else(|| "-".to_string(), |s| s.to_string()),
        )
    }
}

fn step(cmd: String, step: u64) -> ExecRequest {
    ExecRequest {
        step: Some(step),
        cwd: Some("/work".into()),
        ..ExecRequest::shell(cmd)
    }
}

/// The `i`th call of the episode (0-based).
async fn call(s: &Setup, id: &str, i: usize) -> anyhow::Result<()> {
    let c = &s.client;
    let k = i / 5;
    let st = i as u64 + 1;
    let req = match i % 5 {
        0 => {
            let src = format!(
                "def f{k}(x):\n    return x * {k} + 1\n\n\ndef test_f{k}():\n    assert f{k}(2) == {}\n",
                2 * k + 1
            );
            return c
                .write_file_bytes(id, &format!("/work/pkg/m{k}.py"), None, src.into_bytes())
                .await
                .with_context(|| format!("writing m{k}.py"));
        }
        1 => step(
            format!("python3 -c 'import sys; sys.path.insert(0, \"pkg\"); import m{k}; m{k}.test_f{k}(); print(\"ok {k}\")'"),
            st,
        ),
        2 => step(
            format!("git add -A && git -c user.name=bench -c user.email=bench@example.invalid commit -qm 'step {k}' && git rev-list --count HEAD"),
            st,
        ),
        3 => step(format!("sed -i 's/return x/return (x)/' pkg/m{k}.py && python3 -m py_compile pkg/m{k}.py"), st),
        _ => step("grep -rn 'def f' pkg | wc -l && git status --short | wc -l".to_string(), st),
    };
    let r = c
        .exec(id, &req)
        .await
        .with_context(|| format!("call {i}"))?;
    anyhow::ensure!(r.success(), "call {i}: {r:?}");
    Ok(())
}

async fn run_in(s: &Setup, id: &str, n: usize) -> anyhow::Result<(ReviveBench, String)> {
    let c = &s.client;
    c.exec(
        id,
        &ExecRequest::shell("mkdir -p /work/pkg && cd /work && git init -q"),
    )
    .await
    .context("preparing /work")?;
    let t = Instant::now();
    for i in 0..n {
        s.stop.check()?;
        call(s, id, i).await?;
    }
    let record_secs = t.elapsed().as_secs_f64();
    let log = c
        .trajectory(id, None)
        .await
        .context("reading the trajectory")?;
    let recorded_ms: f64 = log.iter().map(|e| e.duration_ms).sum();

    if s.progress {
        eprintln!("bench: revive: reviving an episode of {n} calls");
    }
    let t = Instant::now();
    let r = c.revive(id, false).await.context("revive")?;
    let revive_ms = t.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        r.replayed as usize == log.len(),
        "replayed {} of {} entries",
        r.replayed,
        log.len()
    );
    Ok((
        ReviveBench {
            calls: n,
            record_secs,
            recorded_ms,
            revive_ms,
            node_ms: r.duration_ms,
            replayed: r.replayed,
            divergences: r.divergences,
            first_divergence_step: r.first_divergence.and_then(|d| d.step),
        },
        r.sandbox.id,
    ))
}

/// Runs the revive bench in a new sandbox; both sandboxes are deleted afterwards.
pub async fn revive(s: &Setup, n: usize) -> anyhow::Result<ReviveBench> {
    let mut req = s.request("revive");
    req.image = ImageRef::Name(s.image.clone());
    let sb = s.client.create(&req).await.context("create")?;
    let result = run_in(s, &sb.id, n).await;
    let mut ids = vec![sb.id];
    if let Ok((_, new)) = &result {
        ids.push(new.clone());
    }
    super::delete_all_reporting(&s.client, ids, 2).await?;
    result.map(|(b, _)| b)
}
