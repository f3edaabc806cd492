//! Cluster routes, served by gateways only: the nodes and their drain marks.

use hyper::Method;
use warren_types::ClusterInfo;

use crate::client::{seg, Client};
use crate::error::ClientError;
use crate::failover::Retry;

impl Client {
    /// `GET /v1/cluster`: every node the gateway knows, with its state, capacity and load.
    /// A node daemon answers `404`: only gateways serve it.
    pub async fn cluster(&self) -> Result<ClusterInfo, ClientError> {
        self.call_json(Method::GET, "/v1/cluster", None::<&()>, "the cluster view")
            .await
    }

    /// `POST /v1/cluster/nodes/{id}/drain`: the node takes no new sandboxes and keeps serving
    /// its own. Marking twice is harmless, so the call is repeated like a read.
    pub async fn drain(&self, node: &str) -> Result<(), ClientError> {
        self.mark(node, "drain").await
    }

    /// `POST /v1/cluster/nodes/{id}/undrain`: the node takes new sandboxes again.
    pub async fn undrain(&self, node: &str) -> Result<(), ClientError> {
        self.mark(node, "undrain").await
    }

    /// `DELETE /v1/cluster/nodes/{id}`: forgets a lost node; its sandboxes become unknown
    /// instead of lost. A registered node is refused (`409 conflict`).
    pub async fn forget_node(&self, node: &str) -> Result<(), ClientError> {
        let path = format!("/v1/cluster/nodes/{}", seg(node));
        let (body, ct) = (crate::client::empty_body(), None);
        self.send_as(Retry::Idempotent, Method::DELETE, &path, body, ct, None)
            .await?
            .drain()
            .await
    }

    async fn mark(&self, node: &str, what: &str) -> Result<(), ClientError> {
        let path = format!("/v1/cluster/nodes/{}/{what}", seg(node));
        let (body, ct) = (crate::client::empty_body(), None);
        self.send_as(Retry::Idempotent, Method::POST, &path, body, ct, None)
            .await?
            .drain()
            .await
    }
}
