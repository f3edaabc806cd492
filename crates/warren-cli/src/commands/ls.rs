//! `warren ls`: lists sandboxes as a table (or JSON).

use anyhow::Context as _;
use warren_client::{SandboxInfo, SandboxState};

use super::{parse_kv, Ctx};
use crate::table::{age, now_ms, Table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only sandboxes with this label (repeatable; all must match)
    #[arg(long, short = 'l', value_name = "K=V", value_parser = parse_kv)]
    pub label: Vec<(String, String)>,
    /// Only sandboxes in this state
    #[arg(long, value_parser = ["creating", "running", "paused", "stopped", "failed"])]
    pub state: Option<String>,
    /// Print the sandboxes as a JSON array
    #[arg(long)]
    pub json: bool,
    /// Print ids only, one per line
    #[arg(long, short = 'q', conflicts_with = "json")]
    pub quiet: bool,
}

/// The table `warren ls` prints, with ages measured at `now_ms`.
pub fn render(sandboxes: &[SandboxInfo], now_ms: u64) -> String {
    let mut t = Table::new(["ID", "STATE", "IMAGE", "AGE", "LABELS"]);
    for s in sandboxes {
        let labels: Vec<String> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        t.row([
            s.id.clone(),
            s.state.as_str().to_string(),
            s.image.join("+"),
            age(now_ms.saturating_sub(s.created_at_ms)),
            labels.join(","),
        ]);
    }
    t.render()
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let state = args.state.as_deref().and_then(SandboxState::parse);
    let labels = args.label.into_iter().collect();
    let client = ctx.client()?;
    let mut list = client
        .list(&labels, state)
        .await
        .context("listing sandboxes failed")?;
    list.sort_by(|a, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else if args.quiet {
        for s in &list {
            println!("{}", s.id);
        }
    } else {
        print!("{}", render(&list, now_ms()));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        let s: SandboxInfo = serde_json::from_value(serde_json::json!({
            "id": "n1-01jd0m7x4e8k0k9yq1w2e3r4t5", "substrate": "container", "state": "running",
            "image": ["default", "task:1"],
            "limits": {"cpus": 1.0, "memory_mb": 512, "disk_mb": 1024, "pids": 512},
            "labels": {"job": "7", "team": "rl"}, "env": {}, "workdir": null, "user": null,
            "network": "none", "created_at_ms": 1_000, "expires_at_ms": null,
            "idle_timeout_secs": null, "last_activity_ms": 1_000, "reason": null,
            "idempotency_key": null
        }))
        .unwrap();
        assert_eq!(
            render(&[s], 181_000),
            "ID                             STATE    IMAGE           AGE  LABELS\n\
             n1-01jd0m7x4e8k0k9yq1w2e3r4t5  running  default+task:1  3m   job=7,team=rl\n"
        );
    }
}
