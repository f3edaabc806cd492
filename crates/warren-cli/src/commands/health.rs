//! `warren health`: prints the daemon's health document.

use anyhow::Context as _;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the document on one line (it is JSON either way)
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let health = client.health().await.context("health check failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&health)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&health)?);
    }
    Ok(if health.is_ok() { 0 } else { 1 })
}
