//! `warren resume`: thaws paused sandboxes (any call on a paused sandbox does it too).

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Print each sandbox (SandboxInfo) as JSON, one document a line
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let mut failed = false;
    for id in &args.ids {
        match client.resume(id).await {
            Ok(info) if args.json => println!("{}", serde_json::to_string(&info)?),
            Ok(info) => println!("{id}: {}", info.state.as_str()),
            Err(e) => {
                eprintln!("warren: resuming {id} failed: {e}");
                failed = true;
            }
        }
    }
    Ok(i32::from(failed))
}
