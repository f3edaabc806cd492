//! The cost of a `/metrics` scrape on a node holding many sandboxes: measured by `density`
//! while its sandboxes are alive, so the scrape sees the node at its fullest.
//!
//! Wall time per scrape is timed at the client; the daemon's CPU per scrape is the growth of
//! its own `process_cpu_seconds_total` over the scrapes, divided by their number (the node is
//! otherwise idle: the sandboxes wait). The share of one core at a 5 s scrape interval follows
//! from it.

use serde::Serialize;
use std::time::Instant;
use warren_client::Client;

use crate::stats::Latency;

/// Scrapes per measurement.
pub const SCRAPES: usize = 20;

/// What scraping cost.
#[derive(Debug, Clone, Serialize)]
pub struct Scrape {
    /// Sandboxes on the node while scraped.
    pub sandboxes: usize,
    pub latency: Latency,
    /// Size of one scrape's text.
    pub bytes: usize,
    /// The daemon's CPU time per scrape (`None` when the node does not report its CPU).
    pub cpu_ms_per_scrape: Option<f64>,
    /// That CPU as a share of one core at a 5 s scrape interval, in percent.
    pub core_percent_at_5s: Option<f64>,
}

/// A counter (or gauge) without labels of the node's `/metrics`.
pub(super) fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Scrapes `/metrics` [`SCRAPES`] times, one after the other.
pub async fn measure(client: &Client, sandboxes: usize) -> anyhow::Result<Scrape> {
    let first = client.metrics().await?;
    let cpu_before = value(&first, "process_cpu_seconds_total");
    let mut samples = Vec::with_capacity(SCRAPES);
    let mut last = first;
    for _ in 0..SCRAPES {
        let t = Instant::now();
        last = client.metrics().await?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let cpu_ms_per_scrape = match (cpu_before, value(&last, "process_cpu_seconds_total")) {
        (Some(a), Some(b)) => Some((b - a).max(0.0) * 1000.0 / SCRAPES as f64),
        _ => None,
    };
    Ok(Scrape {
        sandboxes,
        latency: Latency::from_samples(samples),
        bytes: last.len(),
        cpu_ms_per_scrape,
        core_percent_at_5s: cpu_ms_per_scrape.map(|ms| ms / 5000.0 * 100.0),
    })
}

impl Scrape {
    /// One line of the text report.
    pub fn render(&self) -> String {
        let cpu = match (self.cpu_ms_per_scrape, self.core_percent_at_5s) {
            (Some(ms), Some(p)) => {
                format!("; daemon CPU {ms:.2} ms/scrape = {p:.3}% of a core at 5 s")
            }
            _ => String::new(),
        };
        format!(
            "scrape: /metrics with {} sandboxes: p50 {:.2} ms, p99 {:.2} ms over {} scrapes, {} KiB{cpu}\n",
            self.sandboxes,
            self.latency.p50_ms,
            self.latency.p99_ms,
            self.latency.n,
            self.bytes / 1024,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_the_cost() {
        let s = Scrape {
            sandboxes: 5000,
            latency: Latency::from_samples(vec![10.0, 12.0]),
            bytes: 40 << 10,
            cpu_ms_per_scrape: Some(5.0),
            core_percent_at_5s: Some(0.1),
        };
        let line = s.render();
        assert!(line.contains("5000 sandboxes"), "{line}");
        assert!(line.contains("0.100% of a core"), "{line}");
    }
}
