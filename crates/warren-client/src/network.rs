//! `GET/PUT /v1/sandboxes/{id}/network`: a sandbox's network policy.

use hyper::Method;
use warren_types::{NetworkPolicy, NetworkStatus};

use crate::client::{seg, Client};
use crate::error::ClientError;

impl Client {
    /// The sandbox's policy and link.
    pub async fn get_network(&self, id: &str) -> Result<NetworkStatus, ClientError> {
        let path = format!("/v1/sandboxes/{}/network", seg(id));
        self.call_json(Method::GET, &path, None::<&()>, "the network status")
            .await
    }

    /// Replaces the sandbox's policy; new connections follow it at once.
    pub async fn set_network(
        &self,
        id: &str,
        policy: &NetworkPolicy,
    ) -> Result<NetworkStatus, ClientError> {
        let path = format!("/v1/sandboxes/{}/network", seg(id));
        self.call_json(Method::PUT, &path, Some(policy), "the network status")
            .await
    }
}
