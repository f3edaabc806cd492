//! Connecting to etcd, and bounding each unary call in time (streams are not bounded: a
//! watch or a lease keep-alive lives as long as its connection).

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::{ClusterError, Result};

/// How long a unary etcd call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How often HTTP/2 pings go to a connection that received nothing meanwhile. etcd closes a
/// connection that pings more often than its `--grpc-keepalive-min-time` (5 s by default)
/// three times running while it sends nothing ("too_many_pings"): with a 1 s ping, a quiet
/// watch was cut every 4 s. The calls that must notice a dead member sooner have their own
/// bound: unary calls [`CALL_TIMEOUT`], a lease keep-alive its answers every second, the
/// gateways' watch the progress it asks for (see `view`).
pub const PING_EVERY: Duration = Duration::from_secs(10);

/// A client over `endpoints` (`http://host:port`, or `host:port`). Connections are made
/// lazily and balanced over the endpoints; a member that stops answering pings is dropped
/// within [`PING_EVERY`] + 5 s.
pub async fn connect(endpoints: &[String]) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_keep_alive(PING_EVERY, Duration::from_secs(5))
        .with_keep_alive_while_idle(true);
    bounded("connect", Client::connect(endpoints, Some(opts))).await
}

/// Runs one etcd call with [`CALL_TIMEOUT`].
pub async fn bounded<T>(
    what: &'static str,
    call: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
) -> Result<T> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(r) => r.map_err(ClusterError::from),
        Err(_) => Err(ClusterError::Timeout {
            what,
            ms: CALL_TIMEOUT.as_millis() as u64,
        }),
    }
}

/// Splits `a,b,c` into endpoints, dropping empty parts.
pub fn parse_endpoints(list: &str) -> Vec<String> {
    list.split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
