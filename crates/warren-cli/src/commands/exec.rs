//! `warren exec`: runs a command through the streaming endpoint, copying its output to this
//! process's stdout and stderr as it arrives, and exits with the command's status.

use anyhow::Context as _;
use base64::Engine as _;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use warren_client::{ExecEvent, ExecRequest, ExecResult, OutputEncoding};

use super::{parse_kv, Ctx};

/// Exit code when the command's timeout fired (as `timeout(1)`).
pub const EXIT_TIMEOUT: i32 = 124;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Sandbox id
    pub id: String,
    /// Kill the command after this many seconds
    #[arg(long, short = 't')]
    pub timeout: Option<f64>,
    /// Working directory inside the sandbox
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// Environment variable (repeatable)
    #[arg(long, short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// User to run as (name or uid[:gid])
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Run the words of CMD joined by spaces through /bin/sh -c
    #[arg(long, short = 's')]
    pub shell: bool,
    /// Feed this file to the command's stdin (UTF-8, at most 16 MiB)
    #[arg(long, value_name = "PATH")]
    pub stdin_file: Option<std::path::PathBuf>,
    /// When the command ends, kill every process it started (background jobs, daemons);
    /// without it they keep running in the sandbox
    #[arg(long)]
    pub kill_tree: bool,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The exit code `warren exec` reports for a finished command: its own code, 128 + signal
/// when killed, 124 when the timeout fired.
pub fn exit_code(r: &ExecResult) -> i32 {
    if r.timed_out {
        EXIT_TIMEOUT
    } else if let Some(c) = r.exit_code {
        c
    } else if let Some(s) = r.signal {
        128 + s
    } else {
        1
    }
}

/// The request the arguments describe.
pub async fn request(args: &Args) -> anyhow::Result<ExecRequest> {
    let mut req = if args.shell {
        ExecRequest::shell(args.cmd.join(" "))
    } else {
        ExecRequest::argv(args.cmd.clone())
    };
    req.cwd = args.cwd.clone();
    req.env = args.env.iter().cloned().collect();
    req.user = args.user.clone();
    req.timeout_secs = args.timeout;
    req.kill_tree = args.kill_tree;
    req.encoding = OutputEncoding::Base64;
    if let Some(p) = &args.stdin_file {
        let bytes = tokio::fs::read(p)
            .await
            .with_context(|| format!("reading {}", p.display()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| anyhow::anyhow!("{} is not UTF-8; upload it with cp", p.display()))?;
        req.stdin = Some(text);
    }
    Ok(req)
}

/// Decodes one output chunk of a stream requested with `encoding`.
pub fn decode_chunk(data: &str, encoding: OutputEncoding) -> anyhow::Result<Vec<u8>> {
    match encoding {
        OutputEncoding::Utf8 => Ok(data.as_bytes().to_vec()),
        OutputEncoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(data)
            .context("output chunk is not valid base64"),
    }
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let req = request(&args).await?;
    let client = ctx.client()?;
    let mut stream = client
        .exec_stream(&args.id, &req)
        .await
        .context("exec failed")?;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    while let Some(ev) = stream.next().await {
        match ev.context("exec stream broke")? {
            ExecEvent::Stdout { data } => {
                stdout
                    .write_all(&decode_chunk(&data, req.encoding)?)
                    .await?;
                stdout.flush().await?;
            }
            ExecEvent::Stderr { data } => {
                stderr
                    .write_all(&decode_chunk(&data, req.encoding)?)
                    .await?;
                stderr.flush().await?;
            }
            ExecEvent::Exit { result } => {
                if result.stdout_truncated || result.stderr_truncated {
                    eprintln!("warren: output was truncated at the daemon's cap");
                }
                if result.timed_out {
                    eprintln!("warren: command timed out");
                }
                return Ok(exit_code(&result));
            }
            ExecEvent::Error { error } => anyhow::bail!("exec failed: {error}"),
        }
    }
    anyhow::bail!("exec stream ended without an exit status")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let r = |exit_code, signal, timed_out| ExecResult {
            exit_code,
            signal,
            timed_out,
            ..Default::default()
        };
        assert_eq!(exit_code(&r(Some(3), None, false)), 3);
        assert_eq!(exit_code(&r(None, Some(9), false)), 137);
        assert_eq!(exit_code(&r(None, Some(9), true)), 124);
        assert_eq!(exit_code(&r(None, None, false)), 1);
    }

    #[test]
    fn chunks_decode() {
        assert_eq!(decode_chunk("aGk=", OutputEncoding::Base64).unwrap(), b"hi");
        assert_eq!(decode_chunk("hi", OutputEncoding::Utf8).unwrap(), b"hi");
        assert!(decode_chunk("!!", OutputEncoding::Base64).is_err());
    }
}
