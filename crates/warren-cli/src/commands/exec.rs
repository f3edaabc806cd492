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
    /// Kill the command after this long: 90s, 5m, 1.5 (a plain number is seconds)
    #[arg(long, short = 't', value_name = "DURATION", allow_hyphen_values = true, value_parser = warren_types::units::parse_secs)]
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
    /// Keep stdin open and stream it to the command, also from a terminal (stdin that is
    /// not a terminal, such as a pipe or a file, is always streamed unless --no-stdin)
    #[arg(long, short = 'i', conflicts_with_all = ["stdin_file", "no_stdin"])]
    pub interactive: bool,
    /// Do not read this process's stdin (the command's stdin is empty)
    #[arg(long, short = 'n', conflicts_with = "stdin_file")]
    pub no_stdin: bool,
    /// Feed this file to the command's stdin (any bytes, any size)
    #[arg(long, value_name = "PATH")]
    pub stdin_file: Option<std::path::PathBuf>,
    /// When the command ends, kill every process it started (background jobs, daemons);
    /// without it they keep running in the sandbox
    #[arg(long)]
    pub kill_tree: bool,
    /// Most output kept per stream: 16M, 64M (a plain number is MiB; at most 64M) [default:
    /// 64M when streaming, the daemon's 1M with --json]
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = warren_types::units::parse_mib)]
    pub max_output: Option<u64>,
    /// Print the result (ExecResult, output included) as JSON once the command ended, instead
    /// of streaming its output; the exit code is still the command's
    #[arg(long)]
    pub json: bool,
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

/// What `warren exec` adds on stderr after a command ended: why it ended when the exit status
/// cannot say (a timeout, the OOM killer), and `-s` when one word with spaces was not found
/// as a program (`warren exec ID -- 'ls -la /tmp'`).
pub fn notes(args: &Args, r: &ExecResult) -> Vec<String> {
    let mut out = Vec::new();
    if r.timed_out {
        out.push("command timed out".to_string());
    }
    if r.oom_killed {
        out.push(
            "the command was killed by the out-of-memory killer: the sandbox ran out of memory \
             (its processes and an in-memory writable layer share --memory)"
                .to_string(),
        );
    }
    if r.exit_code == Some(127) && !args.shell && args.cmd.len() == 1 && args.cmd[0].contains(' ') {
        out.push(format!(
            "hint: {:?} was run as one program name; to run it through a shell add -s: \
             warren exec {} -s -- {:?}",
            args.cmd[0], args.id, args.cmd[0]
        ));
    }
    out
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
    // A streamed command's output goes to the terminal as it comes, like `docker exec`: let
    // through as much as the API allows unless told otherwise.
    req.max_output_bytes = match (args.max_output, args.json) {
        (Some(mib), _) => Some(mib << 20),
        (None, false) => Some(warren_types::exec::MAX_OUTPUT_CAP),
        (None, true) => None,
    };
    req.encoding = OutputEncoding::Base64;
    Ok(req)
}

/// Where the command's stdin comes from.
enum Input {
    None,
    Stdin,
    File(tokio::fs::File),
}

/// Stdin is streamed when asked (`-i`) or when it is not a terminal (a pipe, a file).
async fn input(args: &Args) -> anyhow::Result<Input> {
    use std::io::IsTerminal as _;
    if let Some(p) = &args.stdin_file {
        let f = tokio::fs::File::open(p)
            .await
            .with_context(|| format!("opening {}", p.display()))?;
        return Ok(Input::File(f));
    }
    if args.no_stdin {
        return Ok(Input::None);
    }
    if args.interactive || !std::io::stdin().is_terminal() {
        return Ok(Input::Stdin);
    }
    Ok(Input::None)
}

/// Puts the collected output into a streamed command's result: as text when both streams are
/// UTF-8, else both as base64.
fn fill_output(r: &mut ExecResult, out: Vec<u8>, err: Vec<u8>) {
    match (String::from_utf8(out), String::from_utf8(err)) {
        (Ok(o), Ok(e)) => {
            r.stdout = o;
            r.stderr = e;
            r.encoding = OutputEncoding::Utf8;
        }
        (o, e) => {
            let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
            r.stdout = b64(o.map(String::into_bytes).unwrap_or_else(|e| e.into_bytes()));
            r.stderr = b64(e.map(String::into_bytes).unwrap_or_else(|e| e.into_bytes()));
            r.encoding = OutputEncoding::Base64;
        }
    }
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
    let stream = match input(&args).await? {
        Input::None => client.exec_stream(&args.id, &req).await,
        Input::Stdin => client.exec_attach(&args.id, &req, tokio::io::stdin()).await,
        Input::File(f) => client.exec_attach(&args.id, &req, f).await,
    };
    let mut stream = stream.context("exec failed")?;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    while let Some(ev) = stream.next().await {
        match ev.context("exec stream broke")? {
            ExecEvent::Stdout { data } if args.json => {
                out.extend_from_slice(&decode_chunk(&data, req.encoding)?)
            }
            ExecEvent::Stderr { data } if args.json => {
                err.extend_from_slice(&decode_chunk(&data, req.encoding)?)
            }
            ExecEvent::Exit { mut result } if args.json => {
                fill_output(&mut result, out, err);
                println!("{}", serde_json::to_string(&result)?);
                return Ok(exit_code(&result));
            }
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
                    eprintln!("warren: output was cut at the cap (--max-output, at most 64M)");
                }
                for line in notes(&args, &result) {
                    eprintln!("warren: {line}");
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
    fn notes_say_why_a_command_ended_and_hint_at_a_shell() {
        use clap::Parser as _;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let args = |words: &[&str]| {
            let mut v = vec!["warren", "n1-x"];
            v.extend(words);
            Cli::try_parse_from(v).unwrap().args
        };
        let ended = |exit_code, oom_killed| ExecResult {
            exit_code,
            signal: exit_code.is_none().then_some(9),
            oom_killed,
            ..Default::default()
        };
        let spaced = args(&["--", "ls -la /tmp"]);
        let n = notes(&spaced, &ended(Some(127), false));
        assert_eq!(n.len(), 1, "{n:?}");
        assert!(
            n[0].contains("-s") && n[0].contains("warren exec n1-x -s --"),
            "{n:?}"
        );
        assert!(notes(
            &args(&["-s", "--", "ls -la /tmp"]),
            &ended(Some(127), false)
        )
        .is_empty());
        assert!(notes(&args(&["--", "ls", "-la"]), &ended(Some(127), false)).is_empty());
        assert!(notes(&spaced, &ended(Some(0), false)).is_empty());
        let n = notes(&args(&["--", "big"]), &ended(None, true));
        assert!(n[0].contains("out-of-memory"), "{n:?}");
    }

    #[test]
    fn chunks_decode() {
        assert_eq!(decode_chunk("aGk=", OutputEncoding::Base64).unwrap(), b"hi");
        assert_eq!(decode_chunk("hi", OutputEncoding::Utf8).unwrap(), b"hi");
        assert!(decode_chunk("!!", OutputEncoding::Base64).is_err());
    }
}
