//! Connecting to etcd, and bounding each unary call in time (streams are not bounded: a
//! watch or a lease keep-alive lives as long as its connection).

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::{ClusterError, Result};

/// How long a unary etcd call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A client over `endpoints` (`http://host:port`, or `host:port`). Connections are made
/// lazily and balanced over the endpoints; HTTP/2 keep-alives notice a dead member in ~2 s.
pub async fn connect(endpoints: &[String]) -> Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
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
