//! `warren shell ID`: an interactive terminal in a sandbox over the pty WebSocket.
//!
//! The local terminal goes into raw mode so every key (Ctrl-C included) reaches the remote
//! side; window size changes are forwarded on SIGWINCH. The terminal is restored on every
//! way out, and the command exits with the remote exit code.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};
use warren_client::PtyEvent;

use super::Ctx;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox id
    pub id: String,
    /// The program to run in the terminal
    #[arg(long, default_value = "/bin/bash")]
    pub cmd: String,
}

/// Puts the terminal in raw mode and takes it out again when dropped.
struct RawMode;

impl RawMode {
    fn enable() -> anyhow::Result<RawMode> {
        crossterm::terminal::enable_raw_mode().context("cannot put the terminal in raw mode")?;
        Ok(RawMode)
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = crossterm::terminal::disable_raw_mode();
    }
}

fn window_size() -> (u16, u16) {
    usable_size(crossterm::terminal::size().ok())
}

/// The terminal's size, or 80×24 when it reports none or a zero side (a serial console, some
/// CI runners, `docker exec` without a TTY size): the daemon refuses 0 rows or columns.
fn usable_size(reported: Option<(u16, u16)>) -> (u16, u16) {
    match reported {
        Some((c, r)) if c > 0 && r > 0 => (c, r),
        _ => (80, 24),
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let client = ctx.client()?;
    let (cols, rows) = window_size();
    let pty = client
        .pty(&args.id, &args.cmd, cols, rows)
        .await
        .with_context(|| format!("cannot open a terminal in {}", args.id))?;
    let (mut tx, mut rx) = pty.split();

    let interactive = std::io::stdin().is_terminal();
    let raw = if interactive {
        Some(RawMode::enable()?)
    } else {
        None
    };
    tx.resize(cols, rows).await?;

    let mut winch = signal(SignalKind::window_change()).context("cannot watch SIGWINCH")?;
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut buf = vec![0u8; 8192];
    let mut stdin_open = true;
    let code = loop {
        tokio::select! {
            ev = rx.next_event() => match ev? {
                Some(PtyEvent::Output(bytes)) => {
                    stdout.write_all(&bytes).await?;
                    stdout.flush().await?;
                }
                Some(PtyEvent::Exit { exit_code, signal }) => {
                    break exit_code.or(signal.map(|s| 128 + s));
                }
                None => break None,
            },
            n = stdin.read(&mut buf), if stdin_open => match n? {
                0 => stdin_open = false,
                n => tx.send(bytes::Bytes::copy_from_slice(&buf[..n])).await?,
            },
            _ = winch.recv() => {
                let (c, r) = window_size();
                tx.resize(c, r).await?;
            }
        }
    };
    let _ = tx.close().await;
    drop(raw);
    match code {
        Some(c) => Ok(c),
        None => {
            eprintln!("warren: the terminal closed without an exit status");
            Ok(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_terminal_without_a_size_gets_80_by_24() {
        use super::usable_size;
        assert_eq!(usable_size(Some((0, 0))), (80, 24));
        assert_eq!(usable_size(Some((120, 0))), (80, 24));
        assert_eq!(usable_size(None), (80, 24));
        assert_eq!(usable_size(Some((132, 43))), (132, 43));
    }
}
