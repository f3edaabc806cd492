//! Drain: `<root>/drain/<id>` present means the node takes no new sandboxes. Stored in etcd
//! without a lease, so a drain outlives restarts of the node and of every gateway.

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
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

/// Forgets a node that is not registered: its `known` and drain keys go, and gateways stop
/// answering `sandbox_lost` for its sandboxes (they become unknown). False when the node is
/// registered (its key exists): a live node is never forgotten.
pub async fn forget(client: &Client, keys: &Keys, id: &NodeId) -> Result<bool> {
    let mut c = client.clone();
    let txn = Txn::new()
        .when([Compare::create_revision(keys.node(id), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::delete(keys.known(id), None),
            TxnOp::delete(keys.drain(id), None),
        ]);
    Ok(bounded("forget", c.txn(txn)).await?.succeeded())
}
