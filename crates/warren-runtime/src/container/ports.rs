//! A container's ports: a TCP socket made in the sandbox's network namespace (the agent's),
//! with or without a network policy (see [`crate::ports`]).

use super::Container;
use crate::error::RuntimeError;
use crate::ports::{connect_in_netns, PortStream};

/// Connects to `127.0.0.1:port` inside the container.
pub(super) async fn connect(c: &Container, port: u16) -> Result<PortStream, RuntimeError> {
    let pid = c.record.agent_pid;
    let netns = warren_sys::ns::open_ns(pid, "net")?;
    // Checked after the open: the namespace opened is the agent's, never a recycled pid's.
    if crate::procfs::start_time(pid) != Some(c.record.agent_start_time) {
        return Err(RuntimeError::AgentLost);
    }
    Ok(Box::new(connect_in_netns(netns, port).await?))
}
