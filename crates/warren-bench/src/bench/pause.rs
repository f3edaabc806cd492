//! `warren-bench pause`: pausing a container sandbox that holds 512 MiB of anonymous memory.
//!
//! A process in the sandbox fills 512 MiB with pages half random, half zero (compressible about
//! 2:1, like most heaps) and sleeps. Each round pauses the sandbox (the node freezes it and
//! pushes its memory out: zram or disk swap), then resumes it and times the first `exec true`
//! after the resume, which pages in only what the agent and `true` touch. The filler's pages
//! come back as it touches them, which it does not while it sleeps.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use warren_client::{CreateSandboxRequest, ExecRequest, ImageRef};

use super::measure::{Setup, BENCH_LABEL};
use crate::stats::Latency;

/// Anonymous memory the filler holds, in MiB.
pub const FILL_MB: u64 = 512;

/// What pausing cost.
#[derive(Debug, Clone, Serialize)]
pub struct PauseBench {
    pub rounds: usize,
    pub fill_mb: u64,
    /// The pause call at the client (freeze, page-out, answer).
    pub pause: Latency,
    /// The node's own measure of each pause.
    pub node_pause: Latency,
    /// Resume and the first `exec true` after it.
    pub resume_to_exec: Latency,
    /// Resident memory of the sandbox before and after the last pause, in MiB.
    pub before_mb: f64,
    pub after_mb: f64,
    /// The share of the resident memory the last pause pushed out.
    pub released: f64,
    /// The node's note when memory could not leave RAM (no swap).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The filler: `FILL_MB` MiB of half-random pages, touched once, then a file saying so.
fn filler(ready: &str) -> String {
    format!(
        "import os,time\n\
         page = os.urandom(2048) + bytes(2048)\n\
         b = bytearray(page * (256 * {FILL_MB}))\n\
         open('{ready}', 'w').write('1')\n\
         time.sleep(3600)\n"
    )
}

pub async fn pause(s: &Setup, rounds: usize) -> anyhow::Result<PauseBench> {
    s.note(format!(
        "pause: {rounds} rounds of pause and resume with {FILL_MB} MiB of anonymous memory"
    ));
    let req = CreateSandboxRequest {
        image: ImageRef::Name(s.image.clone()),
        memory_mb: Some(FILL_MB * 2 + 256),
        labels: BTreeMap::from([
            (BENCH_LABEL.to_string(), s.run_id.clone()),
            (format!("{BENCH_LABEL}.kind"), "pause".to_string()),
        ]),
        ..Default::default()
    };
    let sb = s.client.create(&req).await.context("create")?;
    let result = measure(s, &sb.id, rounds).await;
    s.client
        .delete(&sb.id)
        .await
        .with_context(|| format!("delete {}", sb.id))?;
    result
}

/// Starts a filler and waits until its memory is filled; returns its pid.
async fn fill(s: &Setup, id: &str, round: usize) -> anyhow::Result<u32> {
    let ready = format!("/tmp/warren-bench-filled-{round}");
    let p = s
        .client
        .spawn(id, &ExecRequest::argv(["python3", "-c", &filler(&ready)]))
        .await
        .context("start the filler")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        s.stop.check()?;
        let r = s
            .client
            .exec(id, &ExecRequest::argv(["test", "-f", &ready]))
            .await?;
        if r.success() {
            return Ok(p.pid);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the filler did not fill {FILL_MB} MiB in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each round fills anew (a filler that sleeps never pages its memory back in), pauses,
/// resumes with a first exec, and stops the filler.
async fn measure(s: &Setup, id: &str, rounds: usize) -> anyhow::Result<PauseBench> {
    let (mut wall, mut node, mut back) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for round in 0..rounds.max(1) {
        s.stop.check()?;
        let pid = fill(s, id, round).await?;
        let t = Instant::now();
        let st = s.client.pause(id).await.context("pause")?;
        wall.push(t.elapsed().as_secs_f64() * 1000.0);
        node.push(st.duration_ms);
        let t = Instant::now();
        s.client.resume(id).await.context("resume")?;
        let r = s.client.exec(id, &ExecRequest::argv(["true"])).await?;
        anyhow::ensure!(r.success(), "`true` failed after a resume: {r:?}");
        back.push(t.elapsed().as_secs_f64() * 1000.0);
        s.client
            .kill_process(id, pid, Some(9))
            .await
            .context("stop the filler")?;
        last = Some(st);
    }
    let st = last.expect("at least one round");
    let mb = |b: u64| b as f64 / (1 << 20) as f64;
    Ok(PauseBench {
        rounds: wall.len(),
        fill_mb: FILL_MB,
        pause: Latency::from_samples(wall),
        node_pause: Latency::from_samples(node),
        resume_to_exec: Latency::from_samples(back),
        before_mb: mb(st.memory_before_bytes),
        after_mb: mb(st.memory_after_bytes),
        released: if st.memory_before_bytes > 0 {
            1.0 - st.memory_after_bytes as f64 / st.memory_before_bytes as f64
        } else {
            0.0
        },
        note: st.note,
    })
}

impl PauseBench {
    /// The text report.
    pub fn render(&self) -> String {
        let mut out = format!(
            "pause: {} MiB of anonymous memory, {} rounds: pause p50 {:.0} ms (node {:.0} ms), resume to first exec p50 {:.1} ms; last pause {:.0} → {:.0} MiB resident ({:.0} % out)\n",
            self.fill_mb,
            self.rounds,
            self.pause.p50_ms,
            self.node_pause.p50_ms,
            self.resume_to_exec.p50_ms,
            self.before_mb,
            self.after_mb,
            self.released * 100.0
        );
        if let Some(n) = &self.note {
            out.push_str(&format!("pause: note: {n}\n"));
        }
        out
    }
}
