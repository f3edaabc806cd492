//! `warren`: the command-line front end of a Warren node.
//!
//! Every subcommand is one module under `commands/` with an `Args` struct (clap derive) and a
//! `run` function that returns the process exit code. Adding a subcommand is one variant in
//! [`Command`], one arm in [`dispatch`] and one module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use warren_cli::commands::{self, Ctx};

/// Exit status of `warren` itself, told apart from the exit codes of commands.
const EXIT_WARREN: u8 = 125;

const EXIT_HELP: &str = "\
Exit status:
  exec, call   the command's own exit code; 128+N when killed by signal N; 124 when its
               timeout fired
  125          warren itself failed: the daemon is unreachable, the request was refused
               (bad argument, unknown sandbox or image, ...), or the transfer broke
  other        0 on success; 1 when some of several items failed (rm, pause, ...) or
               health is not ok";

/// Run and drive Warren sandboxes.
#[derive(Debug, Parser)]
#[command(name = "warren", version, propagate_version = true, after_help = EXIT_HELP)]
struct Cli {
    /// The daemon or gateway: unix:///path/to.sock, http://host:port or https://host:port, or
    /// several comma-separated (calls fail over between them) [default: unix:///run/warren/warren.sock]
    #[arg(long, global = true, env = "WARREN_URL")]
    url: Option<String>,

    /// Read the API token from this file (else WARREN_TOKEN).
    #[arg(long, global = true, env = "WARREN_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,

    /// PEM file of the CAs to trust for https URLs (else WARREN_CA, else the system's).
    #[arg(long, global = true, env = "WARREN_CA")]
    ca: Option<std::path::PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run warrend (in the foreground, or in the background with --detach).
    Up(commands::up::Args),
    /// Print the daemon's health; exit 0 when it is ok.
    Health(commands::health::Args),
    /// Create a sandbox and print its id.
    Create(commands::create::Args),
    /// Run a command in a sandbox, streaming its output; exit with its exit code.
    Exec(commands::exec::Args),
    /// Run one stateless command in a warm container of an image; exit with its exit code.
    Call(commands::call::Args),
    /// Copy a file between the host and a sandbox (ID:/path on one side).
    Cp(commands::cp::Args),
    /// List sandboxes.
    Ls(commands::ls::Args),
    /// Delete sandboxes.
    Rm(commands::rm::Args),
    /// Open an interactive terminal in a sandbox.
    Shell(commands::shell::Args),
    /// List the background processes started in a sandbox through the API (spawn), not every
    /// process in it: `warren exec ID -- ps aux` lists those.
    Ps(commands::ps::Args),
    /// Freeze sandboxes and push their memory out of RAM (any call resumes them).
    Pause(commands::pause::Args),
    /// Thaw paused sandboxes.
    Resume(commands::resume::Args),
    /// Show or replace a sandbox's network policy (none, allow lists, services, domains).
    Net(commands::net::Args),
    /// Make N new sandboxes with a copy of one sandbox's files; print their ids.
    Fork(commands::fork::Args),
    /// Save sandboxes as snapshots (a VM's memory and processes too), list and remove them;
    /// `warren create --snapshot ID` starts a sandbox from one.
    Snapshot(commands::snapshot::Args),
    /// Make a new sandbox like a logged one and run its logged calls again; report divergences.
    Revive(commands::revive::Args),
    /// Write a sandbox's trajectory (every call that changed it) to stdout as JSONL.
    Trajectory(commands::trajectory::Args),
    /// Run a small reinforcement-learning style rollout in N sandboxes at once.
    Demo(commands::demo::Args),
    /// Measure the node: runs `warren-bench` (installed beside `warren`) with these arguments.
    #[command(disable_help_flag = true)]
    Bench(commands::bench::Args),
    /// Manage the node's image layers (build, stack, list, inspect, remove, verify).
    Image(commands::image::Args),
    /// Print sandboxes as JSON.
    Inspect(commands::inspect::Args),
    /// Show what sandboxes use (CPU of their limit, memory, disk, processes), live on a terminal.
    Stats(commands::stats::Args),
    /// Give sandboxes a new lifetime from now (`--ttl 30m`).
    Extend(commands::extend::Args),
    /// Print a shell completion script: `warren completion bash > /etc/bash_completion.d/warren`.
    Completion(commands::completion::Args),
    /// Show the nodes of a cluster (needs a gateway URL); drain or undrain a node.
    Cluster(commands::cluster::Args),
}

async fn dispatch(ctx: Ctx, command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Up(a) => commands::up::run(&ctx, a).await,
        Command::Health(a) => commands::health::run(&ctx, a).await,
        Command::Create(a) => commands::create::run(&ctx, a).await,
        Command::Exec(a) => commands::exec::run(&ctx, a).await,
        Command::Call(a) => commands::call::run(&ctx, a).await,
        Command::Cp(a) => commands::cp::run(&ctx, a).await,
        Command::Ls(a) => commands::ls::run(&ctx, a).await,
        Command::Rm(a) => commands::rm::run(&ctx, a).await,
        Command::Shell(a) => commands::shell::run(&ctx, a).await,
        Command::Ps(a) => commands::ps::run(&ctx, a).await,
        Command::Pause(a) => commands::pause::run(&ctx, a).await,
        Command::Resume(a) => commands::resume::run(&ctx, a).await,
        Command::Net(a) => commands::net::run(&ctx, a).await,
        Command::Fork(a) => commands::fork::run(&ctx, a).await,
        Command::Snapshot(a) => commands::snapshot::run(&ctx, a).await,
        Command::Revive(a) => commands::revive::run(&ctx, a).await,
        Command::Trajectory(a) => commands::trajectory::run(&ctx, a).await,
        Command::Demo(a) => commands::demo::run(&ctx, a).await,
        Command::Bench(a) => commands::bench::run(&ctx, a).await,
        Command::Image(a) => commands::image::run(&ctx, a).await,
        Command::Inspect(a) => commands::inspect::run(&ctx, a).await,
        Command::Stats(a) => commands::stats::run(&ctx, a).await,
        Command::Extend(a) => commands::extend::run(&ctx, a).await,
        Command::Completion(a) => {
            ctx.local_only("warren completion", "")?;
            commands::completion::run(a, &mut <Cli as clap::CommandFactory>::command())
        }
        Command::Cluster(a) => commands::cluster::run(&ctx, a).await,
    }
}

/// The error as printed, with what to do when the daemon could not be reached: a socket this
/// user may not open is a permission problem (the daemon runs), anything else a daemon that
/// is not there.
fn explain(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    if !text.contains("cannot connect to warrend at") {
        return text;
    }
    let denied = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    }) || text.contains("os error 13");
    if denied {
        return format!(
            "{text}\n\
             hint: warrend is there but this user may not open its socket. Run as root, or \
             have the daemon grant a group access (`warrend --socket-group warren`, or \
             `./scripts/up.sh --service --group warren`) and join it \
             (`usermod -aG warren $USER`, then log in again)"
        );
    }
    format!(
        "{text}\n\
         hint: is warrend running there? Start it with `warren up --detach` (as root), or \
         `./scripts/up.sh` on a fresh node; or point --url / WARREN_URL at a running daemon \
         (unix:///path/to.sock or http://host:port)"
    )
}

fn main() -> ExitCode {
    let parsed = <Cli as clap::CommandFactory>::command()
        .try_get_matches()
        .and_then(|m| {
            let flag = m.value_source("url") == Some(clap::parser::ValueSource::CommandLine);
            <Cli as clap::FromArgMatches>::from_arg_matches(&m).map(|c| (c, flag))
        });
    let (cli, url_flag) = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_WARREN)
            } else {
                ExitCode::SUCCESS // --help, --version
            };
        }
    };
    let ctx = Ctx {
        url: cli.url,
        url_flag,
        token_file: cli.token_file,
        ca: cli.ca,
    };
    warren_cli::run_main_with("warren", EXIT_WARREN, explain, dispatch(ctx, cli.command))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn completion_scripts_name_the_subcommands() {
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "warren", &mut out);
            let script = String::from_utf8(out).unwrap();
            for sub in ["create", "exec", "inspect", "completion"] {
                assert!(script.contains(sub), "{shell}: no {sub}");
            }
        }
    }

    #[test]
    fn every_command_that_prints_a_result_takes_json() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            let name = sub.get_name();
            // Interactive, streaming or generator commands print no result document.
            // `bench` forwards its arguments to warren-bench, which takes --json itself.
            if [
                "up",
                "shell",
                "trajectory",
                "demo",
                "completion",
                "cp",
                "bench",
            ]
            .contains(&name)
            {
                continue;
            }
            let has = |c: &clap::Command| c.get_arguments().any(|a| a.get_long() == Some("json"));
            if !has(sub) {
                missing.push(name.to_string());
            }
        }
        assert!(missing.is_empty(), "no --json on: {missing:?}");
    }

    #[test]
    fn negative_numbers_get_warrens_own_message() {
        for args in [
            &["warren", "create", "--memory", "-5"][..],
            &["warren", "create", "--disk", "-5G"],
            &["warren", "create", "--ttl", "-5"],
            &["warren", "create", "--pids", "-5"],
            &["warren", "exec", "x", "-t", "-5", "--", "true"],
            &["warren", "extend", "x", "--ttl", "-1h"],
        ] {
            let e = Cli::try_parse_from(args).unwrap_err().to_string();
            assert!(e.contains("negative"), "{args:?}: {e}");
        }
        let e = Cli::try_parse_from(["warren", "create", "--cpus", "-1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not more than 0"), "{e}");
    }

    #[test]
    fn global_url_and_trailing_commands_parse() {
        let cli = Cli::try_parse_from([
            "warren",
            "exec",
            "--url",
            "unix:///tmp/w.sock",
            "n1-x",
            "--timeout",
            "2",
            "--",
            "ls",
            "-la",
        ])
        .unwrap();
        assert_eq!(cli.url.as_deref(), Some("unix:///tmp/w.sock"));
        let Command::Exec(a) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(a.cmd, ["ls", "-la"]);
        assert_eq!(a.timeout, Some(2.0));

        let cli =
            Cli::try_parse_from(["warren", "up", "--detach", "--", "--socket", "/s"]).unwrap();
        let Command::Up(a) = cli.command else {
            panic!("not up")
        };
        assert!(a.detach);
        assert_eq!(a.warrend_args, ["--socket", "/s"]);

        let cli = Cli::try_parse_from([
            "warren", "create", "--image", "base", "--image", "task:1", "--env", "A=b=c",
            "--label", "k=v", "--memory", "256",
        ])
        .unwrap();
        let Command::Create(a) = cli.command else {
            panic!("not create")
        };
        assert_eq!(a.image, ["base", "task:1"]);
        assert_eq!(a.env, [("A".to_string(), "b=c".to_string())]);
        assert_eq!(a.memory, Some(256));

        let cli = Cli::try_parse_from([
            "warren",
            "create",
            "--memory",
            "1.5GiB",
            "--disk",
            "10G",
            "--ttl",
            "5m",
            "--idle-timeout",
            "90s",
        ])
        .unwrap();
        let Command::Create(a) = cli.command else {
            panic!("not create")
        };
        assert_eq!(
            (a.memory, a.disk, a.ttl, a.idle_timeout),
            (Some(1536), Some(10240), Some(300), Some(90))
        );
        let cli = Cli::try_parse_from(["warren", "exec", "x", "-t", "90s", "--", "true"]).unwrap();
        let Command::Exec(a) = cli.command else {
            panic!("not exec")
        };
        assert_eq!(a.timeout, Some(90.0));
        assert!(Cli::try_parse_from(["warren", "create", "--memory", "lots"]).is_err());

        assert!(Cli::try_parse_from(["warren", "rm", "--all", "n1-x"]).is_err());
        assert!(Cli::try_parse_from(["warren", "rm"]).is_err());
        assert!(Cli::try_parse_from(["warren", "create", "--env", "novalue"]).is_err());
        assert!(Cli::try_parse_from(["warren", "bench", "density", "--n", "10"]).is_ok());

        let cli =
            Cli::try_parse_from(["warren", "fork", "n1-x", "-n", "3", "--label", "a=b"]).unwrap();
        let Command::Fork(a) = cli.command else {
            panic!("not fork")
        };
        assert_eq!((a.id.as_str(), a.n), ("n1-x", 3));
        assert_eq!(a.labels, [("a".to_string(), "b".to_string())]);
        let cli =
            Cli::try_parse_from(["warren", "snapshot", "create", "n1-x", "-l", "a=b"]).unwrap();
        assert!(matches!(cli.command, Command::Snapshot(_)));
        assert!(Cli::try_parse_from(["warren", "snapshot", "rm"]).is_err());
        let cli = Cli::try_parse_from(["warren", "create", "--snapshot", "n1-snap-x"]).unwrap();
        let Command::Create(a) = cli.command else {
            panic!("not create")
        };
        assert_eq!(a.snapshot.as_deref(), Some("n1-snap-x"));
        let cli = Cli::try_parse_from([
            "warren",
            "call",
            "--image",
            "default",
            "--timeout",
            "3",
            "--file",
            "a.py:/w/a.py",
            "--",
            "python3",
            "/w/a.py",
        ])
        .unwrap();
        let Command::Call(a) = cli.command else {
            panic!("not call")
        };
        assert_eq!((a.cmd.len(), a.file.len(), a.timeout), (2, 1, Some(3.0)));
        assert!(Cli::try_parse_from(["warren", "pause"]).is_err());
        assert!(Cli::try_parse_from(["warren", "pause", "n1-x", "n1-y"]).is_ok());
        assert!(Cli::try_parse_from(["warren", "trajectory", "n1-x", "--from-seq", "4"]).is_ok());
        let cli = Cli::try_parse_from(["warren", "cluster", "drain", "n7"]).unwrap();
        let Command::Cluster(a) = cli.command else {
            panic!("not cluster")
        };
        assert!(
            matches!(a.action, Some(commands::cluster::Action::Drain { node }) if node == "n7")
        );
        assert!(Cli::try_parse_from(["warren", "cluster", "--json"]).is_ok());
        assert!(Cli::try_parse_from(["warren", "cluster", "undrain"]).is_err());
    }
}
