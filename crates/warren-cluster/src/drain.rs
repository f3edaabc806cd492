//! Drain: `<root>/drain/<id>` present means the node takes no new sandboxes. Stored in etcd
//! without a lease, so a drain outlives restarts of the node and of every gateway.

use etcd_client::Client;
use warren_types::NodeId;

use crate::error::Result;
use crate::etcd::bounded;
use crate::keys::Keys;

/// Marks `id` drained (`true`) or not.
pub async fn set_drain(client: &Client, keys: &Keys, id: &NodeId, drained: bool) -> Result<()> {
    let mut c = client.clone();
    let key = keys.drain(id);
    if drained {
        bounded("drain", c.put(key, b"1".to_vec(), None)).await?;
    } else {
        bounded("undrain", c.delete(key, None)).await?;
    }
    Ok(())
}
