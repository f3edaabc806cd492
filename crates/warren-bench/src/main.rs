//! `warren-bench`: measures a Warren node through its HTTP API and checks the numbers against
//! Warren's targets (see [`bench`] for the table). Installed beside `warren`, which forwards
//! `warren bench …` here; it is its own binary so that the user's CLI does not carry the
//! blob store and lazy-layer code the image benchmarks need.

mod bench;

use std::process::ExitCode;

use clap::Parser;
// What the benchmarks share with the `warren` command's subcommands.
use warren_cli::commands::{delete_all, sweep_label, until_interrupted, Ctx, Stop, STOP_GRACE};
use warren_cli::{commands, stats, table};

/// Measure a Warren node.
#[derive(Debug, Parser)]
#[command(name = "warren-bench", version)]
struct Cli {
    /// The daemon: unix:///path/to.sock or http://host:port
    /// [default: unix:///run/warren/warren.sock]
    #[arg(long, global = true, env = "WARREN_URL")]
    url: Option<String>,

    #[command(flatten)]
    args: bench::Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = Ctx {
        url: cli.url,
        ..Ctx::default()
    };
    warren_cli::run_main(
        "warren-bench",
        async move { bench::run(&ctx, cli.args).await },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
        assert!(Cli::try_parse_from(["warren-bench", "density", "--n", "10"]).is_ok());
        let cli = Cli::try_parse_from(["warren-bench", "--url", "unix:///s", "exec"]).unwrap();
        assert_eq!(cli.url.as_deref(), Some("unix:///s"));
        assert!(Cli::try_parse_from(["warren-bench", "nonsense"]).is_err());
        let curve = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().args.curve;
        assert_eq!(curve(&["warren-bench", "density"]), None);
        assert_eq!(
            curve(&["warren-bench", "density", "--curve"]),
            Some(vec![1000, 2000, 5000, 10000])
        );
        assert_eq!(
            curve(&["warren-bench", "density", "--curve", "1000,5000", "--json"]),
            Some(vec![1000, 5000])
        );
        let report = |argv: &[&str]| Cli::try_parse_from(argv).unwrap().args.report;
        assert_eq!(report(&["warren-bench", "exec"]), None);
        assert_eq!(
            report(&["warren-bench", "all", "--report", "out/run1", "--json"]),
            Some(std::path::PathBuf::from("out/run1"))
        );
        assert_eq!(
            report(&["warren-bench", "--report=r", "images"]),
            Some(std::path::PathBuf::from("r"))
        );
        assert!(Cli::try_parse_from(["warren-bench", "exec", "--report"]).is_err());
    }
}
