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
    crossterm::terminal::size().unwrap_or((80, 24))
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
