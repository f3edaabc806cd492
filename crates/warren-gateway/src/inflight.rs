//! This gateway's own placements that the nodes' published loads do not show yet: requests
//! still in flight, plus those answered since the node last published its load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use warren_types::NodeId;

#[derive(Debug, Default, Clone, Copy)]
struct Count {
    outstanding: u64,
    /// Placements answered since the record of revision `seen` was published.
    recent: u64,
    seen: i64,
}

/// Per-node counts. Cheap to clone; every clone is the same table.
#[derive(Debug, Default, Clone)]
pub struct InFlight {
    counts: Arc<Mutex<HashMap<NodeId, Count>>>,
}

/// One placement on its way; dropping it ends it (counted as done when `placed` was called).
#[derive(Debug)]
pub struct Placement {
    table: InFlight,
    node: NodeId,
    placed: bool,
}

impl Placement {
    /// The node created the sandbox: it counts until the node publishes a newer load.
    pub fn placed(mut self) {
        self.placed = true;
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let mut m = self.table.counts.lock().expect("in-flight lock");
        if let Some(c) = m.get_mut(&self.node) {
            c.outstanding = c.outstanding.saturating_sub(1);
            if self.placed {
                c.recent += 1;
            }
        }
    }
}

impl InFlight {
    /// Starts counting a placement on `node`.
    pub fn begin(&self, node: &NodeId) -> Placement {
        self.counts
            .lock()
            .expect("in-flight lock")
            .entry(node.clone())
            .or_default()
            .outstanding += 1;
        Placement {
            table: self.clone(),
            node: node.clone(),
            placed: false,
        }
    }

    /// The count for `node`, whose published record has revision `revision` (a newer record
    /// includes the placements answered before it, which then stop counting).
    pub fn get(&self, node: &NodeId, revision: i64) -> u64 {
        let mut m = self.counts.lock().expect("in-flight lock");
        let Some(c) = m.get_mut(node) else { return 0 };
        if c.seen != revision {
            c.seen = revision;
            c.recent = 0;
        }
        c.outstanding + c.recent
    }

    /// Requests outstanding on `node`.
    pub fn outstanding(&self, node: &NodeId) -> u64 {
        self.counts
            .lock()
            .expect("in-flight lock")
            .get(node)
            .map(|c| c.outstanding)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_until_the_next_published_load() {
        let t = InFlight::default();
        let n: NodeId = "n1".parse().unwrap();
        assert_eq!(t.get(&n, 1), 0);
        let a = t.begin(&n);
        let b = t.begin(&n);
        assert_eq!(t.get(&n, 1), 2);
        a.placed();
        drop(b); // refused: not placed
        assert_eq!(t.get(&n, 1), 1);
        assert_eq!(t.outstanding(&n), 0);
        assert_eq!(t.get(&n, 2), 0, "a newer record shows it");
    }
}
