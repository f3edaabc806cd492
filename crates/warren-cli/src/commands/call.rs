//! `warren call`: runs one stateless command in a warm container of an image, prints its
//! output, saves the files asked back (`-o REMOTE[:LOCAL]`) on the host and exits with the
//! command's status.

use anyhow::Context as _;
use base64::Engine as _;
use std::io::Write as _;
use warren_client::{CallFile, CallRequest, CallResult, ImageRef, OutputEncoding};

use super::{parse_kv, Ctx};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Image (repeat for a stack of layers, lowest first)
    #[arg(long, short = 'i', default_value = "default")]
    pub image: Vec<String>,
    /// Kill the call after this long: 90s, 5m, 1.5 (a plain number is seconds)
    #[arg(long, short = 't', value_name = "DURATION", allow_hyphen_values = true, value_parser = warren_types::units::parse_secs)]
    pub timeout: Option<f64>,
    /// Copy a host file into the call first: LOCAL:REMOTE (repeatable)
    #[arg(long, short = 'f', value_name = "LOCAL:REMOTE")]
    pub file: Vec<String>,
    /// Save this file of the call's environment to the host after it ran: REMOTE[:LOCAL]
    /// (default LOCAL: REMOTE's name in the current directory; `-` prints it) (repeatable)
    #[arg(long, short = 'o', value_name = "REMOTE[:LOCAL]")]
    pub output: Vec<String>,
    /// Environment variable (repeatable)
    #[arg(long, short = 'e', value_name = "K=V", value_parser = parse_kv)]
    pub env: Vec<(String, String)>,
    /// Working directory
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// Run the words of CMD joined by spaces through /bin/sh -c
    #[arg(long, short = 's')]
    pub shell: bool,
    /// Feed this file to the command's stdin (UTF-8)
    #[arg(long, value_name = "PATH")]
    pub stdin_file: Option<std::path::PathBuf>,
    /// Keep this Python interpreter started in the pool's warm environments
    #[arg(long)]
    pub interpreter: Option<String>,
    /// Module the warm interpreter imports ahead (repeatable)
    #[arg(long)]
    pub preload: Vec<String>,
    /// Memory limit of the pool's containers: 512M, 1G (a plain number is MiB)
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true, value_parser = warren_types::units::parse_mib)]
    pub memory: Option<u64>,
    /// Print the result (CallResult: output and returned files, as the daemon sent them) as
    /// JSON instead of printing the output and saving the files; the exit code is still the
    /// command's
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// The request the arguments describe.
pub async fn request(args: &Args) -> anyhow::Result<CallRequest> {
    let mut req = if args.shell {
        CallRequest {
            shell: Some(args.cmd.join(" ")),
            ..Default::default()
        }
    } else {
        CallRequest::argv(args.cmd.clone())
    };
    req.image = match args.image.as_slice() {
        [one] => ImageRef::Name(one.clone()),
        many => ImageRef::Stack(many.to_vec()),
    };
    req.timeout_secs = args.timeout;
    req.env = args.env.iter().cloned().collect();
    req.cwd = args.cwd.clone();
    req.encoding = OutputEncoding::Base64;
    req.interpreter = args.interpreter.clone();
    req.preload = args.preload.clone();
    req.memory_mb = args.memory;
    req.return_files = args
        .output
        .iter()
        .map(|o| output_spec(o).map(|(remote, _)| remote))
        .collect::<anyhow::Result<_>>()?;
    for f in &args.file {
        let (local, remote) = f
            .rsplit_once(':')
            .with_context(|| format!("--file wants LOCAL:REMOTE, got {f:?}"))?;
        let bytes = tokio::fs::read(local)
            .await
            .with_context(|| format!("reading {local}"))?;
        let mode = std::fs::metadata(local)
            .ok()
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777);
        req.files.push(CallFile {
            path: remote.to_string(),
            content: base64::engine::general_purpose::STANDARD.encode(bytes),
            encoding: OutputEncoding::Base64,
            mode,
        });
    }
    if let Some(p) = &args.stdin_file {
        let bytes = tokio::fs::read(p)
            .await
            .with_context(|| format!("reading {}", p.display()))?;
        req.stdin = Some(
            String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{} is not UTF-8", p.display()))?,
        );
    }
    Ok(req)
}

/// The exit code `warren call` reports: the command's own code, 128 + signal when killed,
/// 124 when the timeout fired (as `warren exec`).
pub fn exit_code(r: &CallResult) -> i32 {
    if r.timed_out {
        super::exec::EXIT_TIMEOUT
    } else if let Some(c) = r.exit_code {
        c
    } else if let Some(s) = r.signal {
        128 + s
    } else {
        1
    }
}

/// `REMOTE[:LOCAL]` of `-o`: the sandbox path and where it goes on the host.
pub fn output_spec(s: &str) -> anyhow::Result<(String, String)> {
    let (remote, local) = match s.split_once(':') {
        Some((r, l)) if !l.is_empty() => (r.to_string(), l.to_string()),
        Some((r, _)) => (r.to_string(), default_local(r)),
        None => (s.to_string(), default_local(s)),
    };
    if !remote.starts_with('/') {
        anyhow::bail!("-o {s:?}: the file in the call's environment must be an absolute path");
    }
    if local.is_empty() {
        anyhow::bail!("-o {s:?}: {remote:?} has no file name; give REMOTE:LOCAL");
    }
    Ok((remote, local))
}

/// REMOTE's file name, in the current directory.
fn default_local(remote: &str) -> String {
    remote
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "..")
        .unwrap_or_default()
        .to_string()
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    let outputs = args
        .output
        .iter()
        .map(|o| output_spec(o))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let req = request(&args).await?;
    let client = ctx.client()?;
    let r = client.call(&req).await.context("call failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(exit_code(&r));
    }
    let dec = |s: &str| super::exec::decode_chunk(s, r.encoding);
    std::io::stdout().write_all(&dec(&r.stdout)?)?;
    std::io::stderr().write_all(&dec(&r.stderr)?)?;
    std::io::stdout().flush()?;
    for f in &r.files {
        match &f.error {
            Some(e) => eprintln!("warren: {}: {e}", f.path),
            None => {
                let content = dec(&f.content)?;
                let target = outputs
                    .iter()
                    .find(|(remote, _)| *remote == f.path)
                    .map(|(_, local)| local.clone())
                    .unwrap_or_else(|| default_local(&f.path));
                if f.truncated {
                    eprintln!(
                        "warren: {} was truncated at {} bytes",
                        f.path,
                        content.len()
                    );
                }
                if target == "-" {
                    std::io::stdout().write_all(&content)?;
                    std::io::stdout().flush()?;
                } else {
                    std::fs::write(&target, &content)
                        .with_context(|| format!("saving {} to {target}", f.path))?;
                }
            }
        }
    }
    if r.stdout_truncated || r.stderr_truncated {
        eprintln!("warren: output was truncated at the daemon's cap");
    }
    if r.timed_out {
        eprintln!("warren: call timed out");
    }
    Ok(exit_code(&r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let r = |exit_code, signal, timed_out| CallResult {
            exit_code,
            signal,
            timed_out,
            ..Default::default()
        };
        assert_eq!(exit_code(&r(Some(3), None, false)), 3);
        assert_eq!(exit_code(&r(None, Some(9), false)), 137);
        assert_eq!(exit_code(&r(None, Some(9), true)), 124);
    }

    #[test]
    fn output_specs() {
        let o = |s| output_spec(s).unwrap();
        assert_eq!(o("/w/out.json"), ("/w/out.json".into(), "out.json".into()));
        assert_eq!(
            o("/w/out.json:res/a.json"),
            ("/w/out.json".into(), "res/a.json".into())
        );
        assert_eq!(o("/w/out.json:-"), ("/w/out.json".into(), "-".into()));
        assert!(output_spec("rel/out").is_err());
        assert!(output_spec("/").is_err());
    }
}
