//! `warren revive`: makes a new sandbox like a logged one (same image stack, limits, labels,
//! network policy), runs the old sandbox's logged calls again in it with the same steps, and
//! prints the new id, and on stderr where the replay first diverged, if it did (then it exits
//! 1; the new sandbox stays).

use anyhow::Context as _;

use super::Ctx;
use crate::progress::Spinner;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The sandbox whose trajectory is replayed (it may have been deleted while its log is
    /// still readable)
    pub id: String,
    /// Stop at the first divergence (the new sandbox keeps the steps replayed so far)
    #[arg(long)]
    pub stop_on_divergence: bool,
    /// Print the report (ReviveReport) as JSON
    #[arg(long)]
    pub json: bool,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let spinner = Spinner::start(format!("reviving {}", args.id));
    let report = client
        .revive(&args.id, args.stop_on_divergence)
        .await
        .with_context(|| format!("reviving {} failed", args.id))?;
    drop(spinner);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(i32::from(report.divergences > 0));
    }
    println!("{}", report.sandbox.id);
    let last = report
        .last_step
        .map_or_else(|| "none".to_string(), |s| s.to_string());
    eprintln!(
        "replayed {} calls ({} steps, last step {last}) in {:.0} ms (recorded: {:.0} ms); skipped {}",
        report.replayed, report.steps_replayed, report.duration_ms, report.recorded_ms, report.skipped
    );
    match &report.first_divergence {
        None => eprintln!("no divergence"),
        Some(d) => {
            let step = d.step.map_or_else(|| "-".to_string(), |s| s.to_string());
            eprintln!(
                "{} divergence(s){}; first at step {step} (seq {}, {}): expected {}, got {}",
                report.divergences,
                if report.stopped {
                    ", stopped there"
                } else {
                    ""
                },
                d.seq,
                d.kind,
                serde_json::to_string(&d.expected)?,
                serde_json::to_string(&d.got)?
            );
        }
    }
    Ok(i32::from(report.divergences > 0))
}
