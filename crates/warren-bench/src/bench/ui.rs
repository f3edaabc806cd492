//! The dashboard's first paint on a full node: with `--ui URL` (the daemon's `/ui` over TCP),
//! `density` loads the overview and the sandboxes table in headless Chromium while its
//! sandboxes are alive, several times each, and reads when each page marked itself drawn with
//! its data (`body[data-ready-ms]`: ms from navigation start, set once the page's first API
//! answers are on screen).

use serde::Serialize;
use std::path::PathBuf;
use std::process::Command;

use crate::stats::Latency;

/// Loads per page.
const LOADS: usize = 5;

/// Draw times of the pages.
#[derive(Debug, Clone, Serialize)]
pub struct Paint {
    pub sandboxes: usize,
    pub overview_ms: Latency,
    pub table_ms: Latency,
}

/// The browser: `$CHROMIUM`, else Debian's `chromium`.
fn browser() -> anyhow::Result<PathBuf> {
    let p = std::env::var_os("CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    if p.is_file() {
        Ok(p)
    } else {
        anyhow::bail!(
            "--ui needs headless Chromium at {} (apt-get install chromium, or set CHROMIUM)",
            p.display()
        )
    }
}

/// `data-ready-ms` of a dumped DOM.
fn ready_ms(dom: &str) -> Option<f64> {
    let at = dom.find("data-ready-ms=\"")? + "data-ready-ms=\"".len();
    dom[at..].split('"').next()?.parse().ok()
}

fn load(browser: &PathBuf, url: &str) -> anyhow::Result<f64> {
    let profile = tempfile::tempdir()?;
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--window-size=1280,1000",
            "--virtual-time-budget=3000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(url)
        .output()?;
    let dom = String::from_utf8_lossy(&out.stdout);
    ready_ms(&dom).ok_or_else(|| anyhow::anyhow!("{url} did not finish drawing"))
}

/// Loads the overview and the table `LOADS` times each.
pub fn measure(ui: &str, sandboxes: usize) -> anyhow::Result<Paint> {
    let browser = browser()?;
    let times = |hash: &str| -> anyhow::Result<Latency> {
        let mut v = Vec::with_capacity(LOADS);
        for _ in 0..LOADS {
            v.push(load(&browser, &format!("{ui}#{hash}"))?);
        }
        Ok(Latency::from_samples(v))
    };
    Ok(Paint {
        sandboxes,
        overview_ms: times("/")?,
        table_ms: times("/sandboxes")?,
    })
}

impl Paint {
    pub fn render(&self) -> String {
        format!(
            "dashboard with {} sandboxes: overview drawn in p50 {:.0} ms (max {:.0}), sandboxes table p50 {:.0} ms (max {:.0}) over {LOADS} loads each\n",
            self.sandboxes,
            self.overview_ms.p50_ms,
            self.overview_ms.max_ms,
            self.table_ms.p50_ms,
            self.table_ms.max_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_mark_is_read() {
        assert_eq!(
            ready_ms("<body data-ready=\"overview\" data-ready-ms=\"412\">"),
            Some(412.0)
        );
        assert_eq!(ready_ms("<body data-ready=\"overview\">"), None);
    }
}
