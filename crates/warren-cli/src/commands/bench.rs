//! `warren bench …`: runs `warren-bench …` (the benchmarks are their own binary, so the
//! `warren` command does not carry their dependencies). `warren-bench` is looked for next to
//! this binary first, then on `PATH`.

use anyhow::Context as _;
use std::path::PathBuf;

use super::Ctx;

/// The binary the benchmarks live in.
pub const BENCH_BIN: &str = "warren-bench";

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Arguments of `warren-bench` (see `warren-bench --help`)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<String>,
}

/// `warren-bench` next to the running binary, else the bare name (found on `PATH`).
pub fn bench_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(BENCH_BIN)))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(BENCH_BIN))
}

/// The command line `warren bench ARGS` runs.
pub fn command(ctx: &Ctx, args: &Args) -> std::process::Command {
    let mut cmd = std::process::Command::new(bench_binary());
    if let Some(url) = &ctx.url {
        cmd.arg("--url").arg(url);
    }
    cmd.args(&args.args);
    cmd
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let mut cmd = tokio::process::Command::from(command(ctx, &args));
    let status = cmd.status().await.with_context(|| {
        format!(
            "running {} (install it beside warren)",
            bench_binary().display()
        )
    })?;
    Ok(status.code().unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_and_the_url_are_handed_over() {
        let ctx = Ctx {
            url: Some("unix:///tmp/w.sock".into()),
            ..Ctx::default()
        };
        let args = Args {
            args: vec!["create".into(), "-n".into(), "5".into(), "--json".into()],
        };
        let cmd = command(&ctx, &args);
        let got: Vec<_> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            got,
            ["--url", "unix:///tmp/w.sock", "create", "-n", "5", "--json"]
        );
        assert!(cmd.get_program().to_string_lossy().ends_with(BENCH_BIN));
    }
}
