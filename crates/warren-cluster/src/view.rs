//! The gateway side of membership: one watch on the root prefix and the view it keeps.
//!
//! The view is rebuilt by a fresh list after a compaction or a lost connection, and is kept
//! as it was while etcd is unreachable or has no quorum (gateways go on routing and placing on
//! it). A node is `lost` only when its key is gone — its lease expired — never because etcd is
//! slow or electing: a new etcd leader extends every lease, so a live node's key stays.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use warren_types::{NodeId, NodeRecord, NodeState, NODE_RECORD_FORMAT};

use crate::etcd::{bounded, connect};
use crate::keys::{KeyKind, Keys};

/// One node as the view knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    /// The last record it published (kept after it is lost).
    pub record: NodeRecord,
    /// Its key is gone.
    pub lost: bool,
    /// Revision of its key's last change.
    pub mod_revision: i64,
}

/// The membership as of one store revision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    pub members: BTreeMap<NodeId, Member>,
    pub drained: BTreeSet<NodeId>,
    pub revision: i64,
    /// The watch is live (false: this is the last view seen).
    pub connected: bool,
}

impl View {
    /// A node's state, or `None` for a node never seen.
    pub fn state(&self, id: &NodeId) -> Option<NodeState> {
        let m = self.members.get(id)?;
        Some(if m.lost {
            NodeState::Lost
        } else if self.drained.contains(id) {
            NodeState::Draining
        } else {
            NodeState::Ready
        })
    }

    /// Nodes that are registered (ready or draining).
    pub fn live(&self) -> impl Iterator<Item = &Member> {
        self.members.values().filter(|m| !m.lost)
    }

    fn apply_put(&mut self, keys: &Keys, kv: &KeyValue) {
        match keys.parse(kv.key()) {
            Some(KeyKind::Node(id)) => match decode(&id, kv.value()) {
                Some(record) => {
                    self.members.insert(
                        id,
                        Member {
                            record,
                            lost: false,
                            mod_revision: kv.mod_revision(),
                        },
                    );
                }
                None => warn!(node = %id, "unreadable node record ignored"),
            },
            Some(KeyKind::Drain(id)) => {
                self.drained.insert(id);
            }
            Some(KeyKind::Known(id)) => {
                // A node registered once: lost until its own key shows (never overrides it).
                if let (std::collections::btree_map::Entry::Vacant(e), Some(record)) =
                    (self.members.entry(id.clone()), decode(&id, kv.value()))
                {
                    e.insert(Member {
                        record,
                        lost: true,
                        mod_revision: kv.mod_revision(),
                    });
                }
            }
            None => {}
        }
    }

    fn apply_delete(&mut self, keys: &Keys, key: &[u8], revision: i64) {
        match keys.parse(key) {
            Some(KeyKind::Node(id)) => {
                if let Some(m) = self.members.get_mut(&id) {
                    if !m.lost {
                        info!(node = %id, "node lost (its lease expired or it left)");
                    }
                    m.lost = true;
                    m.mod_revision = revision;
                }
            }
            Some(KeyKind::Drain(id)) => {
                self.drained.remove(&id);
            }
            // Forgotten: a lost node leaves the view (its sandboxes become unknown).
            Some(KeyKind::Known(id)) if self.members.get(&id).is_some_and(|m| m.lost) => {
                self.members.remove(&id);
            }
            Some(KeyKind::Known(_)) => {}
            None => {}
        }
    }

    /// The view after a fresh list: members not listed any more are lost.
    fn relisted(&self, keys: &Keys, kvs: &[KeyValue], revision: i64) -> View {
        let mut next = View {
            members: BTreeMap::new(),
            drained: BTreeSet::new(),
            revision,
            connected: true,
        };
        for kv in kvs {
            next.apply_put(keys, kv);
        }
        for (id, m) in &self.members {
            if !next.members.contains_key(id) {
                if !m.lost {
                    info!(node = %id, "node lost (not listed any more)");
                }
                next.members.insert(
                    id.clone(),
                    Member {
                        lost: true,
                        ..m.clone()
                    },
                );
            }
        }
        next
    }
}

fn decode(id: &NodeId, value: &[u8]) -> Option<NodeRecord> {
    let r: NodeRecord = serde_json::from_slice(value).ok()?;
    (r.format <= NODE_RECORD_FORMAT && &r.id == id).then_some(r)
}

/// A gateway's live view of the cluster. Cheap to clone; every clone is the same view.
#[derive(Clone)]
pub struct ClusterView {
    shared: Arc<Shared>,
}

struct Shared {
    view: RwLock<Arc<View>>,
    changed: watch::Sender<u64>,
    keys: Keys,
    endpoints: Vec<String>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// For writes (drain marks), connected on first use.
    writer: tokio::sync::Mutex<Option<etcd_client::Client>>,
}

impl std::fmt::Debug for ClusterView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.snapshot();
        f.debug_struct("ClusterView")
            .field("members", &v.members.len())
            .field("revision", &v.revision)
            .field("connected", &v.connected)
            .finish()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().expect("view task lock").take() {
            t.abort();
        }
    }
}

impl ClusterView {
    /// Starts watching `keys` in the etcd at `endpoints`.
    pub fn start(endpoints: Vec<String>, keys: Keys) -> ClusterView {
        let (changed, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            view: RwLock::new(Arc::new(View::default())),
            changed,
            keys,
            endpoints,
            task: std::sync::Mutex::new(None),
            writer: tokio::sync::Mutex::new(None),
        });
        let weak = Arc::downgrade(&shared);
        let task = tokio::spawn(async move { watch_loop(weak).await });
        *shared.task.lock().expect("view task lock") = Some(task);
        ClusterView { shared }
    }

    /// A view that never changes (for tests and tools).
    pub fn fixed(view: View) -> ClusterView {
        let (changed, _) = watch::channel(0);
        ClusterView {
            shared: Arc::new(Shared {
                view: RwLock::new(Arc::new(view)),
                changed,
                keys: Keys::default(),
                endpoints: Vec::new(),
                task: std::sync::Mutex::new(None),
                writer: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The current view.
    pub fn snapshot(&self) -> Arc<View> {
        self.shared.view.read().expect("view lock").clone()
    }

    /// Bumped on every change of the view.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.shared.changed.subscribe()
    }

    pub fn keys(&self) -> &Keys {
        &self.shared.keys
    }

    pub fn endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// Forgets node `id` (see [`crate::drain::forget`]), then waits (up to 2 s) for the view
    /// to drop it. False when the node is registered.
    pub async fn forget(&self, id: &NodeId) -> crate::Result<bool> {
        let client = self.writer().await?;
        match crate::drain::forget(&client, &self.shared.keys, id).await {
            Ok(true) => {
                self.wait_for(Duration::from_secs(2), |v| !v.members.contains_key(id))
                    .await;
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => {
                *self.shared.writer.lock().await = None;
                Err(e)
            }
        }
    }

    /// The client that writes (connected on first use).
    async fn writer(&self) -> crate::Result<etcd_client::Client> {
        let mut w = self.shared.writer.lock().await;
        match &*w {
            Some(c) => Ok(c.clone()),
            None => {
                let c = connect(&self.shared.endpoints).await?;
                *w = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Marks node `id` drained or not in etcd, then waits (up to 2 s) for the view to show it.
    pub async fn set_drain(&self, id: &NodeId, drained: bool) -> crate::Result<()> {
        let client = self.writer().await?;
        if let Err(e) = crate::drain::set_drain(&client, &self.shared.keys, id, drained).await {
            *self.shared.writer.lock().await = None;
            return Err(e);
        }
        self.wait_for(Duration::from_secs(2), |v| {
            v.drained.contains(id) == drained
        })
        .await;
        Ok(())
    }

    /// Waits until `pred` holds for the view, or `limit` passes.
    pub async fn wait_for(&self, limit: Duration, pred: impl Fn(&View) -> bool) -> bool {
        tokio::time::timeout(limit, self.until(&pred)).await.is_ok() || pred(&self.snapshot())
    }

    /// Resolves once `pred` holds for the view; never if the view stops changing first.
    pub async fn until(&self, pred: impl Fn(&View) -> bool) {
        let mut rx = self.subscribe();
        while !pred(&self.snapshot()) {
            if rx.changed().await.is_err() {
                // The watch ended (the view is being dropped): it will never hold.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Shared {
    fn update(&self, f: impl FnOnce(&View) -> View) {
        let mut guard = self.view.write().expect("view lock");
        let next = f(&guard);
        if next != **guard {
            *guard = Arc::new(next);
            drop(guard);
            self.changed.send_modify(|g| *g += 1);
        }
    }
}

async fn watch_loop(weak: std::sync::Weak<Shared>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let endpoints = shared.endpoints.clone();
        let keys = shared.keys.clone();
        drop(shared);
        let ended = watch_once(&weak, &endpoints, &keys).await;
        let Some(shared) = weak.upgrade() else { return };
        shared.update(|v| View {
            connected: false,
            ..v.clone()
        });
        drop(shared);
        match ended {
            Ok(()) => backoff = Duration::from_millis(100),
            // It was live: say so once, and list again soon.
            Err((e, true)) => {
                info!(error = %e, "cluster watch interrupted; keeping the last view and listing again");
                backoff = Duration::from_millis(100);
            }
            Err((e, false)) => {
                debug!(error = %e, "cluster watch not established; keeping the last view");
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

/// How often the watch asks etcd for its progress: the answer shows the watch is live even
/// when nothing changes (keeps the connection busy, see [`crate::etcd::PING_EVERY`]).
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// A watch that has heard nothing (no event, no progress) for this long is given up: its
/// connection or member is gone without a word; a fresh connection lists again.
const SILENCE: Duration = Duration::from_secs(5);

/// One list + watch on a fresh connection, until the watch ends (compaction, cancel) or
/// fails. A failure says whether the watch had been live (listed and watching).
async fn watch_once(
    weak: &std::sync::Weak<Shared>,
    endpoints: &[String],
    keys: &Keys,
) -> Result<(), (crate::ClusterError, bool)> {
    let mut live = false;
    watch_inner(weak, endpoints, keys, &mut live)
        .await
        .map_err(|e| (e, live))
}

async fn watch_inner(
    weak: &std::sync::Weak<Shared>,
    endpoints: &[String],
    keys: &Keys,
    live: &mut bool,
) -> crate::Result<()> {
    let mut client = connect(endpoints).await?;
    let prefix = keys.prefix();
    let listed = bounded(
        "list",
        client.get(prefix.clone(), Some(GetOptions::new().with_prefix())),
    )
    .await?;
    let revision = listed.header().map(|h| h.revision()).unwrap_or(0);
    {
        let Some(shared) = weak.upgrade() else {
            return Ok(());
        };
        shared.update(|v| v.relisted(keys, listed.kvs(), revision));
    }
    let mut stream = bounded(
        "watch",
        client.watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(revision + 1),
            ),
        ),
    )
    .await?;
    *live = true;
    let mut progress = tokio::time::interval(PROGRESS_EVERY);
    progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut heard = tokio::time::Instant::now();
    loop {
        let resp = tokio::select! {
            m = stream.message() => m?,
            _ = progress.tick() => {
                if heard.elapsed() > SILENCE {
                    return Err(crate::ClusterError::Timeout {
                        what: "watch progress",
                        ms: SILENCE.as_millis() as u64,
                    });
                }
                stream.request_progress().await?;
                continue;
            }
        };
        let Some(resp) = resp else {
            return Ok(());
        };
        heard = tokio::time::Instant::now();
        if resp.canceled() || resp.compact_revision() > 0 {
            info!(
                compacted = resp.compact_revision(),
                reason = resp.cancel_reason(),
                "cluster watch cancelled; listing again"
            );
            return Ok(());
        }
        let Some(shared) = weak.upgrade() else {
            return Ok(());
        };
        let rev = resp.header().map(|h| h.revision()).unwrap_or(0);
        shared.update(|v| {
            let mut next = v.clone();
            next.connected = true;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                match ev.event_type() {
                    EventType::Put => next.apply_put(keys, kv),
                    EventType::Delete => next.apply_delete(keys, kv.key(), kv.mod_revision()),
                }
            }
            // A progress answer (no events) may run ahead of events still to come.
            if !resp.events().is_empty() {
                next.revision = next.revision.max(rev);
            }
            next
        });
    }
}
