//! `warren extend`: gives sandboxes a new lifetime from now (their TTL).

use anyhow::Context as _;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// The new lifetime from now: 90s, 30m, 2h (a plain number is seconds)
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = warren_types::units::parse_whole_secs)]
    pub ttl: u64,
    /// Print each sandbox (SandboxInfo) as JSON, one document a line
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    for id in &args.ids {
        let info = client
            .extend(id, args.ttl)
            .await
            .with_context(|| format!("extending {id}"))?;
        if args.json {
            println!("{}", serde_json::to_string(&info)?);
        } else {
            println!("{id}: expires in {} s", args.ttl);
        }
    }
    Ok(0)
}
