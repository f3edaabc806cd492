//! The key layout in etcd. Everything lives under one root (default `/warren`):
//! `<root>/nodes/<id>` (a node's [`warren_types::NodeRecord`], under its lease) and
//! `<root>/drain/<id>` (present while the node is drained; no lease: drain outlives restarts)
//! and `<root>/known/<id>` (the record a node registered with, no lease: a gateway started
//! after the node was lost still knows its sandboxes are lost, not unknown).
//! There are no per-sandbox keys: etcd is never on the create or exec path.

use warren_types::NodeId;

/// The key layout under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    root: String,
}

impl Default for Keys {
    fn default() -> Self {
        Keys::new("/warren")
    }
}

/// What a key under the root names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    Node(NodeId),
    Drain(NodeId),
    Known(NodeId),
}

impl Keys {
    /// A layout under `root` (a trailing `/` is dropped).
    pub fn new(root: &str) -> Self {
        Keys {
            root: root.trim_end_matches('/').to_string(),
        }
    }

    /// The prefix of every key (the one watch of a gateway).
    pub fn prefix(&self) -> String {
        format!("{}/", self.root)
    }

    pub fn node(&self, id: &NodeId) -> String {
        format!("{}/nodes/{id}", self.root)
    }

    pub fn drain(&self, id: &NodeId) -> String {
        format!("{}/drain/{id}", self.root)
    }

    pub fn known(&self, id: &NodeId) -> String {
        format!("{}/known/{id}", self.root)
    }

    /// What `key` names, or `None` for keys of no interest.
    pub fn parse(&self, key: &[u8]) -> Option<KeyKind> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&self.root)?.strip_prefix('/')?;
        let (kind, id) = rest.split_once('/')?;
        let id: NodeId = id.parse().ok()?;
        match kind {
            "nodes" => Some(KeyKind::Node(id)),
            "drain" => Some(KeyKind::Drain(id)),
            "known" => Some(KeyKind::Known(id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = Keys::new("/w/");
        let id: NodeId = "n1".parse().unwrap();
        assert_eq!(k.node(&id), "/w/nodes/n1");
        assert_eq!(
            k.parse(k.node(&id).as_bytes()),
            Some(KeyKind::Node(id.clone()))
        );
        assert_eq!(
            k.parse(k.drain(&id).as_bytes()),
            Some(KeyKind::Drain(id.clone()))
        );
        assert_eq!(k.parse(k.known(&id).as_bytes()), Some(KeyKind::Known(id)));
        assert_eq!(k.parse(b"/w/nodes/BAD"), None);
        assert_eq!(k.parse(b"/w/other/n1"), None);
        assert_eq!(k.parse(b"/x/nodes/n1"), None);
        assert_eq!(k.prefix(), "/w/");
    }
}
