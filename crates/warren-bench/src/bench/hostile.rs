//! `warren bench hostile`: what a hostile sandbox costs the node, measured through the API.
//!
//! - **flood**: `n` calls (default 10,000) of a `yes` flood with a 1 MiB output cap in one
//!   sandbox, from 4 clients. Measures the node's state file (`/v1/health` `state.bytes`) and
//!   the daemon's resident memory (`process_resident_memory_bytes` in `/metrics`) before and
//!   after. Targets: the state file grows by at most the sandbox's trajectory budget + 5%; the
//!   daemon's memory by at most 50 MiB.
//! - **listing**: a sandbox makes `files` files (default 100,000) in one directory; `list`
//!   pages through all of them. Targets: every name seen once, the sandbox still `running`.

use std::time::Instant;

use anyhow::Context as _;
use futures::StreamExt;
use serde::Serialize;
use warren_client::{Client, ExecRequest, SandboxState};

use super::measure::Setup;
use super::Check;

/// What the hostile bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct Hostile {
    pub calls: usize,
    pub flood_secs: f64,
    pub budget_bytes: u64,
    pub state_before_bytes: u64,
    pub state_after_bytes: u64,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    pub outputs_truncated: usize,
    pub files: usize,
    pub listed: usize,
    pub pages: usize,
    pub list_secs: f64,
    pub running_after_list: bool,
}

impl Hostile {
    pub fn checks(&self) -> Vec<Check> {
        let grown = self.state_after_bytes as f64 - self.state_before_bytes as f64;
        let rss = self.rss_after_bytes as f64 - self.rss_before_bytes as f64;
        vec![
            Check::at_most(
                "state file growth / trajectory budget",
                grown / self.budget_bytes.max(1) as f64,
                "x",
                1.05,
            ),
            Check::at_most("daemon RSS growth", rss / (1 << 20) as f64, "MiB", 50.0),
            Check {
                metric: "entries listed".into(),
                value: self.listed as f64,
                unit: "",
                target: format!("= {}", self.files),
                pass: self.listed == self.files,
            },
            Check {
                metric: "sandbox running after the listing".into(),
                value: f64::from(u8::from(self.running_after_list)),
                unit: "",
                target: "= 1".into(),
                pass: self.running_after_list,
            },
        ]
    }

    pub fn render(&self) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        format!(
            "hostile: {} calls of a yes flood capped at 1 MiB in {:.1} s ({} truncated): state \
             file {:.1} -> {:.1} MiB (+{:.1} MiB, budget {:.0} MiB); daemon RSS {:.1} -> {:.1} MiB\n\
             hostile: {} files in one directory listed in {} pages ({} entries) in {:.2} s; \
             sandbox {}\n",
            self.calls,
            self.flood_secs,
            self.outputs_truncated,
            mib(self.state_before_bytes),
            mib(self.state_after_bytes),
            mib(self.state_after_bytes.saturating_sub(self.state_before_bytes)),
            mib(self.budget_bytes),
            mib(self.rss_before_bytes),
            mib(self.rss_after_bytes),
            self.files,
            self.pages,
            self.listed,
            self.list_secs,
            if self.running_after_list {
                "still running"
            } else {
                "NOT running"
            }
        )
    }
}

/// The node's state file size and the daemon's resident memory.
async fn node_usage(c: &Client) -> anyhow::Result<(u64, u64)> {
    let h = c.health().await.context("reading /v1/health")?;
    let state = h
        .extra
        .get("state")
        .and_then(|s| s["bytes"].as_u64())
        .context("the node does not report its state size (older warrend?)")?;
    let metrics = c.metrics().await?;
    let rss = metrics
        .lines()
        .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("the node does not report process_resident_memory_bytes")?;
    Ok((state, rss as u64))
}

pub async fn hostile(s: &Setup, calls: usize, files: usize) -> anyhow::Result<Hostile> {
    let c = &s.client;
    // The baseline is the node before the sandbox exists.
    let (state_before_bytes, rss_before_bytes) = node_usage(c).await?;
    let id = c.create(&s.request("hostile")).await?.id;
    let info = c.get(&id).await?;
    let budget_bytes = info.limits.trajectory_mb << 20;
    // A `yes` flood capped at 1 MiB of kept output (4 MiB written per call). Each call's
    // output starts with its own number: outputs are stored by digest, and a flood of equal
    // outputs would be stored once and measure nothing.
    let flood = |i: usize| {
        let mut f = ExecRequest::shell(format!("echo {i}; yes | head -c 4194304"));
        f.max_output_bytes = Some(1 << 20);
        f
    };
    let t = Instant::now();
    let results: Vec<anyhow::Result<bool>> = futures::stream::iter(0..calls)
        .map(|i| {
            let (c, id, flood) = (c.clone(), id.clone(), flood(i));
            async move {
                s.stop.check()?;
                let r = c.exec(&id, &flood).await?;
                if s.progress && (i + 1) % 1000 == 0 {
                    eprintln!("hostile: {} calls", i + 1);
                }
                Ok(r.stdout_truncated)
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    let flood_secs = t.elapsed().as_secs_f64();
    let mut outputs_truncated = 0;
    for r in results {
        outputs_truncated += usize::from(r?);
    }
    let (state_after_bytes, rss_after_bytes) = node_usage(c).await?;

    // The listing: the sandbox fills one directory, the client pages through it.
    let mut make = ExecRequest::argv([
        "python3".to_string(),
        "-c".into(),
        format!(
            "import os\nos.makedirs('/tmp/many')\nfor i in range({files}):\n    \
             open('/tmp/many/f%07d-%s' % (i, 'x' * 48), 'w').close()"
        ),
    ]);
    make.timeout_secs = Some(600.0);
    let r = c.exec(&id, &make).await?;
    anyhow::ensure!(r.success(), "making {files} files failed: {}", r.stderr);
    let t = Instant::now();
    let (mut listed, mut pages, mut after) = (0usize, 0usize, None::<String>);
    let mut last = String::new();
    loop {
        s.stop.check()?;
        let page = c
            .list_page(&id, "/tmp/many", after.as_deref(), None)
            .await?;
        pages += 1;
        for e in &page.entries {
            anyhow::ensure!(e.name > last, "listing out of order at {}", e.name);
            last.clone_from(&e.name);
        }
        listed += page.entries.len();
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    let list_secs = t.elapsed().as_secs_f64();
    let running_after_list = c.get(&id).await?.state == SandboxState::Running
        && c.exec(&id, &ExecRequest::argv(["true"])).await?.success();
    c.delete(&id).await?;
    Ok(Hostile {
        calls,
        flood_secs,
        budget_bytes,
        state_before_bytes,
        state_after_bytes,
        rss_before_bytes,
        rss_after_bytes,
        outputs_truncated,
        files,
        listed,
        pages,
        list_secs,
        running_after_list,
    })
}
