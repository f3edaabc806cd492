//! `warren snapshot`: save a sandbox under a snapshot id, list, inspect and remove snapshots.
//! `warren create --snapshot ID` starts a sandbox from one.

use anyhow::Context as _;
use warren_client::CreateSnapshotRequest;

use super::{parse_kv, Ctx};
use crate::table::{age, bytes, now_ms, Table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print the result as JSON
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum Cmd {
    /// Save a sandbox (running or paused; it keeps running) and print the snapshot's id. A
    /// VM's memory and processes are saved too; a container's files.
    Create {
        /// The sandbox
        id: String,
        /// A label of the snapshot, KEY=VALUE (repeatable)
        #[arg(long = "label", short = 'l', value_parser = parse_kv)]
        labels: Vec<(String, String)>,
    },
    /// List snapshots.
    Ls {
        /// Print only the ids
        #[arg(long, short = 'q')]
        quiet: bool,
    },
    /// Print snapshots as JSON; exit 1 if one does not exist.
    Inspect {
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Remove snapshots (sandboxes made from them stay).
    Rm {
        #[arg(required = true)]
        ids: Vec<String>,
    },
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    match args.cmd {
        Cmd::Create { id, labels } => {
            let req = CreateSnapshotRequest {
                labels: labels.into_iter().collect(),
            };
            let s = client
                .snapshot(&id, &req)
                .await
                .with_context(|| format!("snapshot of {id} failed"))?;
            if args.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!("{}", s.id);
            }
            Ok(0)
        }
        Cmd::Ls { quiet } => {
            let all = client
                .snapshots()
                .await
                .context("listing snapshots failed")?;
            if args.json {
                println!("{}", serde_json::to_string(&all)?);
                return Ok(0);
            }
            if quiet {
                for s in &all {
                    println!("{}", s.id);
                }
                return Ok(0);
            }
            let now = now_ms();
            let mut t = Table::new([
                "SNAPSHOT",
                "SANDBOX",
                "SUBSTRATE",
                "HOLDS",
                "SIZE",
                "CREATED",
            ]);
            for s in &all {
                t.row([
                    s.id.clone(),
                    s.sandbox.clone(),
                    s.substrate.as_str().to_string(),
                    if s.processes { "processes" } else { "files" }.to_string(),
                    bytes(s.size_bytes),
                    format!("{} ago", age(now.saturating_sub(s.created_at_ms))),
                ]);
            }
            print!("{}", t.render());
            Ok(0)
        }
        Cmd::Inspect { ids } => {
            let mut out = Vec::new();
            let mut code = 0;
            for id in ids {
                match client.get_snapshot(&id).await {
                    Ok(s) => out.push(s),
                    Err(e) => {
                        eprintln!("warren: {id}: {e}");
                        code = 1;
                    }
                }
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
            Ok(code)
        }
        Cmd::Rm { ids } => {
            let mut code = 0;
            for id in ids {
                match client.delete_snapshot(&id).await {
                    Ok(()) => println!("{id}"),
                    Err(e) => {
                        eprintln!("warren: {id}: {e}");
                        code = 1;
                    }
                }
            }
            Ok(code)
        }
    }
}
