//! `warren stats`: what sandboxes use (CPU against their limit, memory, disk, processes), as
//! a table refreshed in place on a terminal like `docker stats`, once with `--no-stream`, or
//! as JSON.

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use futures::{stream, StreamExt as _};
use warren_client::{Client, SandboxState, SandboxStats};

use super::{parse_kv, Ctx};
use crate::table::{bytes, Table};

/// Stats reads in flight at once.
const CONCURRENCY: usize = 16;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids (default: every running or paused sandbox)
    pub ids: Vec<String>,
    /// Without ids: only sandboxes with this label (repeatable; all must match)
    #[arg(long, short = 'l', value_name = "K=V", value_parser = parse_kv)]
    pub label: Vec<(String, String)>,
    /// Print once and exit (the default when stdout is not a terminal)
    #[arg(long)]
    pub no_stream: bool,
    /// Print the figures as a JSON array, once
    #[arg(long)]
    pub json: bool,
    /// Seconds between refreshes on a terminal
    #[arg(long, default_value_t = 2.0, value_parser = positive_secs)]
    pub interval: f64,
}

fn positive_secs(s: &str) -> Result<f64, super::ArgError> {
    match s.parse::<f64>() {
        Ok(v) if v >= 0.1 && v.is_finite() => Ok(v),
        _ => Err(super::ArgError::NotSeconds(s.to_string())),
    }
}

fn pct(part: Option<u64>, whole: u64) -> String {
    match part {
        Some(p) if whole > 0 => format!("{:.1}%", p as f64 * 100.0 / whole as f64),
        _ => "-".into(),
    }
}

fn of(used: Option<u64>, limit: u64) -> String {
    match used {
        Some(u) => format!("{} / {}", bytes(u), bytes(limit)),
        None => format!("- / {}", bytes(limit)),
    }
}

/// The table `warren stats` prints.
pub fn render(stats: &[SandboxStats]) -> String {
    let mut t = Table::new([
        "ID",
        "STATE",
        "CPU",
        "MEM USAGE / LIMIT",
        "MEM",
        "DISK / LIMIT",
        "PIDS",
        "IDLE",
    ]);
    for s in stats {
        t.row([
            s.id.clone(),
            s.state.as_str().to_string(),
            s.cpu_share
                .map_or("-".into(), |c| format!("{:.1}%", c * 100.0)),
            of(s.memory_bytes, s.memory_limit_bytes),
            pct(s.memory_bytes, s.memory_limit_bytes),
            of(s.disk_bytes, s.disk_limit_bytes),
            s.pids
                .map_or("-".into(), |p| format!("{p} / {}", s.pids_limit)),
            crate::table::age((s.idle_secs * 1000.0) as u64),
        ]);
    }
    t.render()
}

/// The stats of `ids`, in their order; sandboxes gone meanwhile are left out.
async fn read(client: &Client, ids: &[String]) -> anyhow::Result<Vec<SandboxStats>> {
    let results: Vec<_> = stream::iter(ids.iter().cloned())
        .map(|id| async move { (client.stats(&id).await, id) })
        .buffered(CONCURRENCY)
        .collect()
        .await;
    let mut out = Vec::with_capacity(results.len());
    for (r, id) in results {
        match r {
            Ok(s) => out.push(s),
            Err(e) if e.code() == Some(warren_client::ErrorCode::NotFound) => {}
            Err(e) => return Err(e).with_context(|| format!("reading the stats of {id}")),
        }
    }
    Ok(out)
}

async fn targets(client: &Client, args: &Args) -> anyhow::Result<Vec<String>> {
    if !args.ids.is_empty() {
        return Ok(args.ids.clone());
    }
    let labels = args.label.iter().cloned().collect();
    let mut list = client
        .list(&labels, None)
        .await
        .context("listing sandboxes failed")?;
    list.retain(|s| matches!(s.state, SandboxState::Running | SandboxState::Paused));
    list.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
    Ok(list.into_iter().map(|s| s.id).collect())
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let live = !args.no_stream && !args.json && std::io::stdout().is_terminal();
    let ids = targets(&client, &args).await?;
    // Named sandboxes that cannot be read are an error; a listing's may end meanwhile.
    if !args.ids.is_empty() && !live {
        let mut out = Vec::new();
        for id in &ids {
            out.push(
                client
                    .stats(id)
                    .await
                    .with_context(|| format!("reading the stats of {id}"))?,
            );
        }
        return print_once(&out, args.json);
    }
    if !live {
        return print_once(&read(&client, &ids).await?, args.json);
    }
    // The first read starts each sandbox's CPU window; the table shows the next ones.
    read(&client, &ids).await?;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(args.interval)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
        let ids = targets(&client, &args).await?;
        let stats = read(&client, &ids).await?;
        // Home and clear, then the table: a refresh in place.
        print!("\x1b[H\x1b[2J{}", render(&stats));
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
}

fn print_once(stats: &[SandboxStats], json: bool) -> anyhow::Result<i32> {
    if json {
        println!("{}", serde_json::to_string_pretty(stats)?);
    } else {
        print!("{}", render(stats));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        let s: SandboxStats = serde_json::from_value(serde_json::json!({
            "id": "n1-01jd0m7x4e8k0k9yq1w2e3r4t5", "state": "running", "sampled_at_ms": 5_000,
            "cpu_usec": 250_000, "cpu_share": 0.125, "window_secs": 2.0, "cpus": 1.0,
            "memory_bytes": 64u64 << 20, "memory_peak_bytes": 80u64 << 20,
            "memory_limit_bytes": 512u64 << 20, "disk_bytes": 3u64 << 20,
            "disk_limit_bytes": 1u64 << 30, "pids": 3, "pids_limit": 512, "oom_kills": 0,
            "trajectory_bytes": 100, "trajectory_budget_bytes": 32u64 << 20, "idle_secs": 42.5
        }))
        .unwrap();
        let out = render(&[s]);
        let row = out.lines().nth(1).unwrap();
        for cell in [
            "12.5%",
            "64.0MiB / 512.0MiB",
            "12.5%",
            "3.0MiB / 1.00GiB",
            "3 / 512",
            "42s",
        ] {
            assert!(row.contains(cell), "{cell:?} not in {row:?}");
        }
    }
}
