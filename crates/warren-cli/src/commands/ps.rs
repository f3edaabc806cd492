//! `warren ps ID`: lists the background processes started through the API (`spawn`), which
//! the node keeps track of; the sandbox's other processes are its own (`ps aux` in it).

use anyhow::Context as _;
use warren_client::{ProcessInfo, ProcessState};

use super::Ctx;
use crate::table::{age, now_ms, Table};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox id
    pub id: String,
    /// Print the processes as a JSON array
    #[arg(long)]
    pub json: bool,
}

/// The table `warren ps` prints, with ages measured at `now_ms`.
pub fn render(processes: &[ProcessInfo], now_ms: u64) -> String {
    let mut t = Table::new(["PID", "STATE", "EXIT", "AGE", "COMMAND"]);
    for p in processes {
        let state = match p.state {
            ProcessState::Running => "running",
            ProcessState::Exited => "exited",
        };
        let exit = match (p.exit_code, p.signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "-".to_string(),
        };
        t.row([
            p.pid.to_string(),
            state.to_string(),
            exit,
            age(now_ms.saturating_sub(p.started_at_ms)),
            p.argv.join(" "),
        ]);
    }
    t.render()
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let mut list = client
        .list_processes(&args.id)
        .await
        .with_context(|| format!("listing processes of {} failed", args.id))?;
    list.sort_by_key(|p| p.pid);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
    } else {
        print!("{}", render(&list, now_ms()));
        eprintln!(
            "warren: {} started through the API (spawn); every process of the sandbox: \
             warren exec {} -- ps aux",
            crate::table::count(list.len() as u64, "background process"),
            args.id
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        let p = |pid, state, exit_code, signal| ProcessInfo {
            pid,
            argv: vec!["sleep".into(), "60".into()],
            state,
            exit_code,
            signal,
            started_at_ms: 0,
        };
        let out = render(
            &[
                p(7, ProcessState::Running, None, None),
                p(12, ProcessState::Exited, None, Some(9)),
            ],
            5_000,
        );
        assert_eq!(
            out,
            "PID  STATE    EXIT      AGE  COMMAND\n\
             7    running  -         5s   sleep 60\n\
             12   exited   signal 9  5s   sleep 60\n"
        );
    }
}
