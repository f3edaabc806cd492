//! `warren health`: prints the daemon's health document.

use anyhow::Context as _;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(ctx: &Ctx, _args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let health = client.health().await.context("health check failed")?;
    println!("{}", serde_json::to_string_pretty(&health)?);
    Ok(if health.is_ok() { 0 } else { 1 })
}
