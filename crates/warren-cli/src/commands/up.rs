//! `warren up`: runs `warrend`, found next to the `warren` executable or on `PATH`.
//!
//! In the foreground this process becomes warrend (exec). With `--detach` warrend starts in
//! its own session with its output in a log file, and `warren up` returns once the daemon
//! answers `/v1/health`, printing the socket it listens on.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use warren_client::{Client, Endpoint};

use super::Ctx;

/// How long a detached daemon has to answer its first health check.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Start warrend in the background and wait until it answers
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// Log file of a detached warrend
    #[arg(long, default_value = "/var/log/warren/warrend.log")]
    pub log: PathBuf,
    /// Arguments for warrend (after --)
    #[arg(last = true, value_name = "WARREND_ARGS")]
    pub warrend_args: Vec<String>,
}

/// The first executable named `name` in the directory of this executable, then on `PATH`.
fn find_binary(name: &str) -> anyhow::Result<PathBuf> {
    let beside = std::env::current_exe().ok().and_then(|exe| {
        let p = exe.parent()?.join(name);
        is_executable(&p).then_some(p)
    });
    if let Some(p) = beside {
        return Ok(p);
    }
    if let Some(p) = find_on_path(name) {
        return Ok(p);
    }
    bail!("cannot find {name} next to the warren executable or on PATH")
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The endpoint a daemon started with `args` will listen on: its `--socket` when given,
/// else `--url` / `WARREN_URL`, else the default socket.
pub fn endpoint_for(args: &[String], url: Option<&str>) -> anyhow::Result<Endpoint> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--socket" {
            if let Some(p) = it.next() {
                return Ok(Endpoint::Unix(PathBuf::from(p)));
            }
        } else if let Some(p) = a.strip_prefix("--socket=") {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
    }
    Ok(match url {
        Some(u) => Endpoint::parse(u)?,
        None => Endpoint::from_env()?,
    })
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<i32> {
    if let (Some(u), true) = (&ctx.url, ctx.url_flag) {
        bail!(
            "`warren up` starts warrend on this host and cannot start one at {u}: drop --url and \
             give warrend its address after `--` (`warren up -d -- --socket PATH` or \
             `-- --listen HOST:PORT`)"
        );
    }
    let warrend = find_binary("warrend")?;
    if !args.detach {
        let err = Command::new(&warrend).args(&args.warrend_args).exec();
        return Err(err).with_context(|| format!("cannot run {}", warrend.display()));
    }

    let endpoint = endpoint_for(&args.warrend_args, ctx.url.as_deref())?;
    if let Some(dir) = args.log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .with_context(|| format!("opening {}", args.log.display()))?;
    // setsid(1) gives the daemon its own session, so the terminal's hangup and job-control
    // signals never reach it; without it, a new process group is the next best thing.
    let mut cmd = match find_on_path("setsid") {
        Some(setsid) => {
            let mut c = Command::new(setsid);
            c.arg(&warrend);
            c
        }
        None => {
            let mut c = Command::new(&warrend);
            c.process_group(0);
            c
        }
    };
    cmd.args(&args.warrend_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("duplicating the log file handle")?)
        .stderr(log);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", warrend.display()))?;

    let client = Client::builder().url(endpoint.to_string()).build()?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "warrend exited during start-up ({status}); see {}",
                args.log.display()
            );
        }
        if let Ok(Ok(h)) = tokio::time::timeout(Duration::from_secs(1), client.health()).await {
            if h.is_ok() {
                break;
            }
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!(
                "warrend (pid {}) did not answer at {endpoint} within {}s; see {}",
                child.id(),
                READY_TIMEOUT.as_secs(),
                args.log.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "warrend is up (pid {}, log {})",
        child.id(),
        args.log.display()
    );
    match endpoint.socket_path() {
        Some(p) => println!("{}", p.display()),
        None => println!("{endpoint}"),
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_from_args() {
        let s = |v: &[&str], url| {
            let v: Vec<String> = v.iter().map(|s| s.to_string()).collect();
            endpoint_for(&v, url).unwrap().to_string()
        };
        assert_eq!(s(&["--socket", "/tmp/w.sock"], None), "unix:///tmp/w.sock");
        assert_eq!(
            s(&["-v", "--socket=/a.sock"], Some("http://h:1")),
            "unix:///a.sock"
        );
        assert_eq!(s(&[], Some("http://h:1")), "http://h:1");
    }
}
