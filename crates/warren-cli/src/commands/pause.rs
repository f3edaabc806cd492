//! `warren pause`: freezes sandboxes and pushes their memory out of RAM; prints what each
//! pause reclaimed.

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox ids
    #[arg(required = true)]
    pub ids: Vec<String>,
    /// Print the pause stats as JSON, one document a line
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let mut failed = false;
    for id in &args.ids {
        match client.pause(id).await {
            Ok(s) if args.json => println!("{}", serde_json::to_string(&s)?),
            Ok(s) => {
                let mib = |b: u64| b as f64 / (1 << 20) as f64;
                println!(
                    "{id}: paused in {:.1} ms, memory {:.1} -> {:.1} MiB{}",
                    s.duration_ms,
                    mib(s.memory_before_bytes),
                    mib(s.memory_after_bytes),
                    s.note.map(|n| format!(" ({n})")).unwrap_or_default()
                );
            }
            Err(e) => {
                eprintln!("warren: pausing {id} failed: {e}");
                failed = true;
            }
        }
    }
    Ok(i32::from(failed))
}
