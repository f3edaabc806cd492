//! Ports: a connection to a TCP port inside a sandbox, for the API's HTTP forwarding
//! (`/v1/sandboxes/{id}/ports/{port}/...`). The [`Ports`] part hands out a byte stream from
//! the sandbox's runtime and keeps the sandbox busy (never idle-paused) while it is open; what
//! flows over it is the API's business. A paused sandbox is resumed first, as for every call.
//! Port traffic is not a call of the trajectory: it is not logged.

use warren_runtime::PortStream;
use warren_types::{ApiError, SandboxId};

use super::{ActivityGuard, Manager};
use crate::error::NodeError;

/// An open connection to a port inside a sandbox.
pub struct PortConnection {
    pub stream: PortStream,
    /// Keeps the sandbox counted busy until the connection is done with.
    pub guard: ActivityGuard,
}

/// Connections to ports inside the manager's sandboxes. Owns nothing.
#[derive(Clone, Debug)]
pub struct Ports {
    sandboxes: Manager,
}

impl Ports {
    /// Ports of the sandboxes of `sandboxes`.
    pub fn new(sandboxes: Manager) -> Ports {
        Ports { sandboxes }
    }

    /// Connects to `127.0.0.1:port` inside sandbox `id`, resuming it first when paused.
    pub async fn connect_port(
        &self,
        id: &SandboxId,
        port: u16,
    ) -> Result<PortConnection, NodeError> {
        if port == 0 {
            return Err(NodeError::Invalid(ApiError::invalid(
                "port must be a number 1-65535, got 0",
            )));
        }
        let (instance, _, guard) = self.sandboxes.ready(id).await?;
        let stream = instance
            .connect_port(port)
            .await
            .map_err(|e| NodeError::runtime(id, e))?;
        Ok(PortConnection { stream, guard })
    }
}
