//! `warren trajectory`: writes a sandbox's trajectory to stdout as JSONL, one entry a line,
//! as the daemon sends it.

use anyhow::Context as _;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox id
    pub id: String,
    /// Start at this entry (entries are numbered from 1)
    #[arg(long)]
    pub from_seq: Option<u64>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let mut body = client
        .trajectory_raw(&args.id, args.from_seq)
        .await
        .with_context(|| format!("reading the trajectory of {} failed", args.id))?;
    let mut out = tokio::io::stdout();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the trajectory stream broke off")?;
        out.write_all(&chunk).await.context("writing to stdout")?;
    }
    out.flush().await.context("writing to stdout")?;
    Ok(0)
}
