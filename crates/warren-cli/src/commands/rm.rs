//! `warren rm`: deletes sandboxes by id, or every sandbox with `--all`, concurrently.

use anyhow::Context as _;

use super::{delete_all, Ctx};

/// Deletes in flight at once.
const CONCURRENCY: usize = 64;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub ids: Vec<String>,
    /// Delete every sandbox on the node
    #[arg(long, short = 'a')]
    pub all: bool,
    /// Print `{"deleted":[ids],"failed":[{"id","error"}]}`
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client_with(CONCURRENCY)?;
    let ids = if args.all {
        client
            .list(&Default::default(), None)
            .await
            .context("listing sandboxes failed")?
            .into_iter()
            .map(|s| s.id)
            .collect()
    } else {
        args.ids
    };
    let total = ids.len();
    let failed = delete_all(&client, ids.clone(), CONCURRENCY).await;
    if args.json {
        let deleted: Vec<&String> = ids
            .iter()
            .filter(|id| !failed.iter().any(|(f, _)| f == *id))
            .collect();
        let failed_json: Vec<serde_json::Value> = failed
            .iter()
            .map(|(id, e)| serde_json::json!({"id": id, "error": e.to_string()}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"deleted": deleted, "failed": failed_json})
        );
        return Ok(if failed.is_empty() { 0 } else { 1 });
    }
    for id in &ids {
        if !failed.iter().any(|(f, _)| f == id) {
            println!("{id}");
        }
    }
    for (id, e) in &failed {
        eprintln!("warren: deleting {id} failed: {e}");
    }
    if args.all && total > 0 {
        eprintln!("deleted {} of {total} sandboxes", total - failed.len());
    }
    Ok(if failed.is_empty() { 0 } else { 1 })
}
