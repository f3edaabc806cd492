//! Calls to a node that stops answering: a node that is hung (stopped, partitioned, its
//! kernel still accepting connections) would hold a forwarded call forever, and no timeout
//! fits every call (an exec may rightly run for an hour). The cluster's own verdict ends the
//! wait instead: a call is waited for while its node stays registered, and given up when the
//! node's lease expires (about 3 s after it stopped renewing) and the node does not answer
//! within [`LOST_NODE_WAIT`] after that.

use std::future::Future;
use std::time::Duration;

use warren_cluster::ClusterView;
use warren_types::{NodeId, NodeState};

/// How long a node whose registration expired may take to answer before its sandboxes are
/// called lost (it may be alive and only cut off from etcd, or about to register again).
pub const LOST_NODE_WAIT: Duration = Duration::from_secs(1);

/// `work`'s output, or `None` if `node` is (or becomes) lost or leaves the view and `work`
/// does not finish within [`LOST_NODE_WAIT`] after that. A node registered again meanwhile
/// is waited for as before: a live node's call is never cut short by a moment of absence.
pub async fn unless_lost<T>(
    view: &ClusterView,
    node: &NodeId,
    work: impl Future<Output = T>,
) -> Option<T> {
    let work = std::pin::pin!(work);
    let mut work = work;
    loop {
        tokio::select! {
            out = &mut work => return Some(out),
            () = lost(view, node) => {}
        }
        tokio::select! {
            out = &mut work => return Some(out),
            () = registered(view, node) => {}
            () = tokio::time::sleep(LOST_NODE_WAIT) => return None,
        }
    }
}

/// Resolves once `node` is lost or gone from the view; never while it is registered.
async fn lost(view: &ClusterView, node: &NodeId) {
    view.until(|v| matches!(v.state(node), None | Some(NodeState::Lost)))
        .await
}

/// Resolves once `node` is registered (ready or draining).
async fn registered(view: &ClusterView, node: &NodeId) {
    view.until(|v| matches!(v.state(node), Some(NodeState::Ready | NodeState::Draining)))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_cluster::{Member, View};
    use warren_types::{NodeCapacity, NodeLoad, NodeRecord, Substrate, NODE_RECORD_FORMAT};

    fn member(id: &NodeId) -> Member {
        Member {
            record: NodeRecord {
                format: NODE_RECORD_FORMAT,
                id: id.clone(),
                incarnation: "1".into(),
                address: "http://127.0.0.1:9".into(),
                version: "0".into(),
                started_at_ms: 0,
                substrates: vec![Substrate::Container],
                capacity: NodeCapacity::default(),
                load: NodeLoad::default(),
                pools: Vec::new(),
                images: Default::default(),
                layers: Vec::new(),
                blob_store: false,
            },
            lost: false,
            mod_revision: 1,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_is_given_up_only_when_its_node_is_lost() {
        let id: NodeId = "n1".parse().unwrap();
        let mut v = View::default();
        v.members.insert(id.clone(), member(&id));
        let view = ClusterView::fixed(v.clone());
        // Registered: the work's answer comes back.
        assert_eq!(unless_lost(&view, &id, async { 7 }).await, Some(7));
        // Lost: a call that would never end is given up (after the grace).
        v.members.get_mut(&id).unwrap().lost = true;
        let view = ClusterView::fixed(v);
        let hung = std::future::pending::<u8>();
        assert_eq!(unless_lost(&view, &id, hung).await, None);
        // Lost, but the node answers within the grace: the answer comes back.
        let late = async {
            tokio::time::sleep(LOST_NODE_WAIT / 2).await;
            8
        };
        assert_eq!(unless_lost(&view, &id, late).await, Some(8));
        // Unknown node: given up too.
        let other: NodeId = "n2".parse().unwrap();
        assert_eq!(
            unless_lost(&view, &other, std::future::pending::<u8>()).await,
            None
        );
    }
}
