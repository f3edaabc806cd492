//! `warren fork`: makes N new sandboxes with a copy of one sandbox's files and prints their
//! ids, one a line.

use anyhow::Context as _;
use warren_client::ForkRequest;

use super::{parse_kv, Ctx};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox to fork (running or paused)
    pub id: String,
    /// How many children (1-64)
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    pub n: u32,
    /// A label for the children, KEY=VALUE (repeatable; merged over the parent's)
    #[arg(long = "label", value_parser = parse_kv)]
    pub labels: Vec<(String, String)>,
    /// Print the children (SandboxInfo) as a JSON array instead of their ids
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let req = ForkRequest {
        n: args.n,
        labels: args.labels.into_iter().collect(),
    };
    let kids = client
        .fork(&args.id, &req)
        .await
        .with_context(|| format!("forking {} failed", args.id))?;
    if args.json {
        println!("{}", serde_json::to_string(&kids)?);
        return Ok(0);
    }
    for k in kids {
        println!("{}", k.id);
    }
    Ok(0)
}
