//! One module per subcommand. Each has an `Args` struct and
//! `async fn run(&Ctx, Args) -> anyhow::Result<i32>` returning the exit code. `bench` only
//! hands its arguments to the `warren-bench` binary.

pub mod bench;
pub mod call;
pub mod cluster;
pub mod completion;
pub mod cp;
pub mod create;
pub mod demo;
pub mod exec;
pub mod extend;
pub mod fork;
pub mod health;
pub mod image;
pub mod image_build;
pub mod inspect;
pub mod ls;
pub mod net;
pub mod pause;
pub mod ps;
pub mod resume;
pub mod revive;
pub mod rm;
pub mod shell;
pub mod snapshot;
pub mod stats;
pub mod trajectory;
pub mod up;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use warren_client::Client;

/// What every subcommand may need: the daemon URL from `--url` / `WARREN_URL`, the token
/// file of `--token-file` (else the client reads `WARREN_TOKEN`), the CA file of `--ca` /
/// `WARREN_CA`.
#[derive(Debug, Clone, Default)]
pub struct Ctx {
    pub url: Option<String>,
    /// The URL came from `--url` on the command line (not from `WARREN_URL`).
    pub url_flag: bool,
    pub token_file: Option<std::path::PathBuf>,
    pub ca: Option<std::path::PathBuf>,
}

impl Ctx {
    /// For a command that works on this host only (`what`): refuses `--url`, which it could
    /// not honour, and says that `WARREN_URL` is not used, so no flag is silently ignored.
    pub fn local_only(&self, what: &str, instead: &str) -> anyhow::Result<()> {
        match (&self.url, self.url_flag) {
            (Some(u), true) => anyhow::bail!(
                "`{what}` works on this host only and cannot act on the daemon at {u}: drop \
                 --url{instead}"
            ),
            (Some(u), false) => {
                eprintln!(
                    "warren: note: `{what}` works on this host only; WARREN_URL ({u}) is not used"
                );
                Ok(())
            }
            (None, _) => Ok(()),
        }
    }

    /// A client for the chosen daemon.
    pub fn client(&self) -> anyhow::Result<Client> {
        self.client_with(warren_client::DEFAULT_MAX_CONNECTIONS)
    }

    /// A client that may keep up to `max_connections` requests in flight.
    pub fn client_with(&self, max_connections: usize) -> anyhow::Result<Client> {
        let mut b = Client::builder().max_connections(max_connections);
        if let Some(u) = &self.url {
            b = b.url(u.clone());
        }
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?;
            let token = token.trim();
            anyhow::ensure!(
                !token.is_empty(),
                "the token file {} is empty",
                path.display()
            );
            b = b.token(token);
        }
        if let Some(ca) = &self.ca {
            b = b.ca_file(ca.clone());
        }
        b.build().context("cannot set up the client")
    }
}

/// A flag's value that does not parse (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("expected KEY=VALUE, got {0:?}")]
    NotKeyValue(String),
    #[error("{0:?} is not a number of seconds of at least 0.1")]
    NotSeconds(String),
}

/// Parses `KEY=VALUE` (the value may itself contain `=`).
pub fn parse_kv(s: &str) -> Result<(String, String), ArgError> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(ArgError::NotKeyValue(s.to_string())),
    }
}

/// Deletes `ids` with up to `concurrency` calls at once; returns the ids that failed, with
/// why. Sandboxes that are already gone count as deleted.
pub async fn delete_all(
    client: &Client,
    ids: Vec<String>,
    concurrency: usize,
) -> Vec<(String, warren_client::ClientError)> {
    futures::stream::iter(ids)
        .map(|id| async move {
            match client.delete(&id).await {
                Ok(()) => None,
                Err(e) if e.is_not_found() => None,
                Err(e) => Some((id, e)),
            }
        })
        .buffer_unordered(concurrency.max(1))
        .filter_map(|r| async move { r })
        .collect()
        .await
}

/// Set on the first Ctrl-C of a long-running command: it stops starting new calls and lets
/// the calls in flight finish, so that every sandbox it created is known and deleted (a
/// create abandoned mid-call may leave a sandbox the command never hears of).
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// An error when the stop flag is set, for `?` between steps.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.is_set() {
            anyhow::bail!("interrupted");
        }
        Ok(())
    }
}

/// How long calls in flight may take to finish after Ctrl-C.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// Drives `fut` to the end. On Ctrl-C, sets `stop` and keeps driving it for up to `grace` so
/// that calls in flight finish; a second Ctrl-C or the end of the grace period abandons it.
/// Returns the output (if it finished) and whether Ctrl-C was pressed.
pub async fn until_interrupted<F: Future>(
    fut: F,
    stop: &Stop,
    grace: Duration,
) -> (Option<F::Output>, bool) {
    tokio::pin!(fut);
    tokio::select! {
        out = &mut fut => return (Some(out), false),
        _ = tokio::signal::ctrl_c() => {}
    }
    stop.set();
    eprintln!("interrupted: finishing the calls in flight (Ctrl-C again to stop at once)");
    tokio::select! {
        out = &mut fut => (Some(out), true),
        _ = tokio::signal::ctrl_c() => (None, true),
        _ = tokio::time::sleep(grace) => (None, true),
    }
}

/// Runs each future as a task and waits for all; results come back in input order. Dropping
/// the returned future aborts the tasks still running, so Ctrl-C stops the work instead of
/// only no longer waiting for it.
pub async fn run_tasks<F, T>(futures: impl IntoIterator<Item = F>) -> Vec<anyhow::Result<T>>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut index = std::collections::HashMap::new();
    for (i, f) in futures.into_iter().enumerate() {
        index.insert(set.spawn(f).id(), i);
    }
    let mut out: Vec<Option<anyhow::Result<T>>> = (0..index.len()).map(|_| None).collect();
    while let Some(r) = set.join_next_with_id().await {
        match r {
            Ok((id, v)) => out[index[&id]] = Some(Ok(v)),
            Err(e) => out[index[&e.id()]] = Some(Err(anyhow::anyhow!("task failed: {e}"))),
        }
    }
    out.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("task lost"))))
        .collect()
}

/// Deletes every sandbox labelled `key=value`, listing again until none is left: creates
/// that were in flight when their task was stopped still land a moment later. Returns how
/// many were deleted.
pub async fn sweep_label(client: &Client, key: &str, value: &str) -> usize {
    let labels = BTreeMap::from([(key.to_string(), value.to_string())]);
    let mut deleted = 0;
    let mut empty_rounds = 0;
    for _ in 0..40 {
        let ids: Vec<String> = match client.list(&labels, None).await {
            Ok(list) => list.into_iter().map(|s| s.id).collect(),
            Err(_) => break,
        };
        if ids.is_empty() {
            empty_rounds += 1;
            if empty_rounds == 2 {
                break;
            }
        } else {
            empty_rounds = 0;
            let n = ids.len();
            deleted += n - delete_all(client, ids, 32).await.len();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_keep_order_and_report_panics() {
        let futs = (0..5u64).map(|i| async move {
            tokio::time::sleep(Duration::from_millis(20 - i * 4)).await;
            assert!(i != 3, "task 3 fails");
            i
        });
        let out = run_tasks(futs).await;
        let ok: Vec<Option<u64>> = out.iter().map(|r| r.as_ref().ok().copied()).collect();
        assert_eq!(ok, [Some(0), Some(1), Some(2), None, Some(4)]);
    }

    #[test]
    fn key_values() {
        assert_eq!(parse_kv("a=b").unwrap(), ("a".into(), "b".into()));
        assert_eq!(parse_kv("a=").unwrap(), ("a".into(), "".into()));
        assert_eq!(parse_kv("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_kv("=b").is_err());
        assert!(parse_kv("ab").is_err());
    }
}
