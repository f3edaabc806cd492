//! `warren completion SHELL`: prints a completion script for bash, zsh or fish.

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The shell
    pub shell: clap_complete::Shell,
}

/// Writes the script for `cmd` (the whole `warren` command) to stdout.
pub fn run(args: Args, cmd: &mut clap::Command) -> anyhow::Result<i32> {
    clap_complete::generate(args.shell, cmd, "warren", &mut std::io::stdout());
    Ok(0)
}
