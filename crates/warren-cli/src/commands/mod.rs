//! One module per subcommand. Each has an `Args` struct and
//! `async fn run(&Ctx, Args) -> anyhow::Result<i32>` returning the exit code.

pub mod bench;
pub mod cp;
pub mod create;
pub mod demo;
pub mod exec;
pub mod health;
pub mod ls;
pub mod ps;
pub mod rm;
pub mod shell;
pub mod up;

use anyhow::Context as _;
use futures::StreamExt;
use warren_client::Client;

/// What every subcommand may need: the daemon URL from `--url` / `WARREN_URL`.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub url: Option<String>,
}

impl Ctx {
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
        b.build().context("bad daemon URL")
    }
}

/// Parses `KEY=VALUE` (the value may itself contain `=`).
pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values() {
        assert_eq!(parse_kv("a=b").unwrap(), ("a".into(), "b".into()));
        assert_eq!(parse_kv("a=").unwrap(), ("a".into(), "".into()));
        assert_eq!(parse_kv("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_kv("=b").is_err());
        assert!(parse_kv("ab").is_err());
    }
}
