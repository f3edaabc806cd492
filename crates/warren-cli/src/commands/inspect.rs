//! `warren inspect`: prints sandboxes (SandboxInfo) as JSON.

use anyhow::Context as _;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// One compact document a line (default: indented)
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    for id in &args.ids {
        let info = client
            .get(id)
            .await
            .with_context(|| format!("inspecting {id}"))?;
        if args.json {
            println!("{}", serde_json::to_string(&info)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
    }
    Ok(0)
}
