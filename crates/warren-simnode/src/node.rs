//! One simulated node: sandboxes as records in memory, a modelled create latency and memory,
//! the admission rules of a real node, and the record it publishes in etcd.
//!
//! Nothing here isolates or runs anything; it exists so that gateways, placement and etcd can
//! be measured at a scale one machine cannot hold in real sandboxes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use warren_types::sandbox::LimitBounds;
use warren_types::{
    ApiError, CreateSandboxRequest, ErrorCode, Limits, NodeCapacity, NodeId, NodeLoad, NodeRecord,
    SandboxInfo, SandboxState, Substrate, NODE_RECORD_FORMAT,
};

/// The model of a simulated node.
#[derive(Debug, Clone)]
pub struct Model {
    /// How long a create takes (an async wait: it costs no CPU).
    pub create_latency: Duration,
    /// The memory the node pretends to have, in MiB.
    pub memory_mb: u64,
    /// New sandboxes are refused while less than this would stay free, in MiB.
    pub min_free_memory_mb: u64,
    /// Most sandboxes held at once.
    pub max_sandboxes: u64,
    /// Most creates in progress at once.
    pub max_starting: u64,
    /// `retry_after` of a refusal, in seconds.
    pub retry_after_secs: u64,
}

/// The sandboxes of one node, by the ULID part of their id (the node's listing order).
#[derive(Debug, Default)]
struct Table {
    sandboxes: BTreeMap<String, SandboxInfo>,
    by_key: HashMap<String, String>,
    reserved_mb: u64,
}

/// One simulated node.
#[derive(Debug)]
pub struct SimNode {
    pub id: NodeId,
    pub address: String,
    pub incarnation: String,
    pub started_at_ms: u64,
    model: Model,
    table: Mutex<Table>,
    starting: AtomicU64,
}

/// Why a create did not happen.
pub type Refusal = ApiError;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl SimNode {
    pub fn new(id: NodeId, address: String, model: Model) -> SimNode {
        SimNode {
            id,
            address,
            incarnation: ulid::Ulid::new().to_string().to_lowercase(),
            started_at_ms: now_ms(),
            model,
            table: Mutex::new(Table::default()),
            starting: AtomicU64::new(0),
        }
    }

    fn busy(&self, why: &str) -> Refusal {
        let mut e = ApiError::new(ErrorCode::Busy, format!("node {} {why}", self.id));
        e.retry_after = Some(self.model.retry_after_secs);
        e
    }

    /// Creates a sandbox, or answers the one an earlier create with the same idempotency key
    /// made (`Ok((info, false))`).
    pub async fn create(&self, req: CreateSandboxRequest) -> Result<(SandboxInfo, bool), Refusal> {
        let limits = req.validate(&Limits::default(), &LimitBounds::default())?;
        if req.substrate != Substrate::Container && req.substrate != Substrate::Function {
            return Err(ApiError::new(
                ErrorCode::UnsupportedSubstrate,
                format!(
                    "a simulated node serves containers only, not {}",
                    req.substrate.as_str()
                ),
            ));
        }
        let ulid = ulid::Ulid::new().to_string().to_lowercase();
        let id = format!("{}-{ulid}", self.id);
        {
            let mut t = self.table.lock().unwrap();
            if let Some(key) = &req.idempotency_key {
                if let Some(existing) = t.by_key.get(key) {
                    let (_, u) = existing.split_once('-').unwrap_or_default();
                    if let Some(sb) = t.sandboxes.get(u) {
                        return Ok((sb.clone(), false));
                    }
                }
            }
            let starting = self.starting.load(Ordering::SeqCst);
            if starting >= self.model.max_starting {
                return Err(self.busy(&format!("has {starting} sandboxes starting")));
            }
            if t.sandboxes.len() as u64 + starting >= self.model.max_sandboxes {
                return Err(self.busy("is full"));
            }
            let free = self.model.memory_mb.saturating_sub(t.reserved_mb);
            if free < limits.memory_mb + self.model.min_free_memory_mb {
                return Err(self.busy("is short of memory"));
            }
            t.reserved_mb += limits.memory_mb;
            if let Some(key) = &req.idempotency_key {
                t.by_key.insert(key.clone(), id.clone());
            }
            let info = SandboxInfo {
                id: id.clone(),
                substrate: req.substrate,
                state: SandboxState::Creating,
                image: req.image.refs(),
                limits,
                labels: req.labels.clone(),
                env: req.env.clone(),
                workdir: req.workdir.clone(),
                user: req.user.clone(),
                network: req.network.clone(),
                created_at_ms: now_ms(),
                expires_at_ms: None,
                idle_timeout_secs: None,
                last_activity_ms: now_ms(),
                reason: None,
                idempotency_key: req.idempotency_key.clone(),
                tenant: None,
                pty: false,
            };
            t.sandboxes.insert(ulid.clone(), info);
            self.starting.fetch_add(1, Ordering::SeqCst);
        }
        tokio::time::sleep(self.model.create_latency).await;
        self.starting.fetch_sub(1, Ordering::SeqCst);
        let mut t = self.table.lock().unwrap();
        match t.sandboxes.get_mut(&ulid) {
            Some(sb) => {
                sb.state = SandboxState::Running;
                Ok((sb.clone(), true))
            }
            // Deleted while it was being created.
            None => Err(ApiError::new(
                ErrorCode::StartFailed,
                format!("{id} was deleted while it started"),
            )),
        }
    }

    pub fn get(&self, id: &str) -> Option<SandboxInfo> {
        let (_, ulid) = id.split_once('-')?;
        self.table.lock().unwrap().sandboxes.get(ulid).cloned()
    }

    pub fn delete(&self, id: &str) -> bool {
        let Some((_, ulid)) = id.split_once('-') else {
            return false;
        };
        let mut t = self.table.lock().unwrap();
        match t.sandboxes.remove(ulid) {
            Some(sb) => {
                t.reserved_mb = t.reserved_mb.saturating_sub(sb.limits.memory_mb);
                if let Some(k) = &sb.idempotency_key {
                    t.by_key.remove(k);
                }
                true
            }
            None => false,
        }
    }

    /// Sandboxes carrying every label of `labels` (and in `state`), in id order, after the
    /// ULID `after`, at most `limit`; with whether the list was cut.
    pub fn list(
        &self,
        labels: &[(String, String)],
        state: Option<SandboxState>,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> (Vec<SandboxInfo>, bool) {
        let t = self.table.lock().unwrap();
        let range = match after {
            Some(a) => t
                .sandboxes
                .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => t.sandboxes.range::<str, _>(..),
        };
        let limit = limit.unwrap_or(usize::MAX);
        let mut out = Vec::new();
        for (_, sb) in range {
            if state.is_some_and(|s| s != sb.state) {
                continue;
            }
            if !labels
                .iter()
                .all(|(k, v)| sb.labels.get(k).is_some_and(|x| x == v))
            {
                continue;
            }
            if out.len() == limit {
                return (out, true);
            }
            out.push(sb.clone());
        }
        (out, false)
    }

    /// The load as a real node publishes it.
    pub fn load(&self) -> NodeLoad {
        let t = self.table.lock().unwrap();
        let creating = self.starting.load(Ordering::SeqCst);
        let held = t.sandboxes.len() as u64;
        NodeLoad {
            creating,
            running: held.saturating_sub(creating),
            paused: 0,
            stopped: 0,
            failed: 0,
            memory_reserved_mb: t.reserved_mb,
            memory_available_mb: self.model.memory_mb.saturating_sub(t.reserved_mb),
            cpu_pressure: 0.0,
            by_substrate: [("container".to_string(), held)].into(),
        }
    }

    pub fn sandbox_count(&self) -> usize {
        self.table.lock().unwrap().sandboxes.len()
    }

    /// The record published under the node's lease.
    pub fn record(&self) -> NodeRecord {
        NodeRecord {
            format: NODE_RECORD_FORMAT,
            id: self.id.clone(),
            incarnation: self.incarnation.clone(),
            address: self.address.clone(),
            version: format!("{}-simulated", env!("CARGO_PKG_VERSION")),
            started_at_ms: self.started_at_ms,
            substrates: vec![Substrate::Container],
            capacity: NodeCapacity {
                max_sandboxes: self.model.max_sandboxes,
                max_running: self.model.max_sandboxes,
                max_starting: self.model.max_starting,
                memory_total_mb: self.model.memory_mb,
                min_free_memory_mb: self.model.min_free_memory_mb,
                max_sandbox_memory_mb: LimitBounds::default().max_memory_mb,
            },
            load: self.load(),
            pools: Vec::new(),
            // The model holds the default image; digests come from the "blob store".
            images: BTreeMap::from([("default:latest".to_string(), Vec::new())]),
            layers: Vec::new(),
            // Any image is "fetchable": the model has no image store.
            blob_store: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(max_starting: u64, memory_mb: u64) -> SimNode {
        SimNode::new(
            "s1".parse().unwrap(),
            "http://127.0.0.1:1".into(),
            Model {
                create_latency: Duration::ZERO,
                memory_mb,
                min_free_memory_mb: 0,
                max_sandboxes: 100,
                max_starting,
                retry_after_secs: 1,
            },
        )
    }

    fn req(labels: &[(&str, &str)], key: Option<&str>) -> CreateSandboxRequest {
        CreateSandboxRequest {
            memory_mb: Some(256),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            idempotency_key: key.map(str::to_string),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn creates_lists_pages_and_deletes() {
        let n = node(8, 1 << 20);
        let mut ids = Vec::new();
        for i in 0..5 {
            let b = if i % 2 == 0 { "even" } else { "odd" };
            let (sb, fresh) = n.create(req(&[("k", b)], None)).await.unwrap();
            assert!(fresh && sb.state == SandboxState::Running);
            assert!(sb.id.starts_with("s1-"));
            ids.push(sb.id);
        }
        let (even, cut) = n.list(&[("k".into(), "even".into())], None, None, None);
        assert_eq!((even.len(), cut), (3, false));
        let (page, cut) = n.list(&[], None, None, Some(2));
        assert_eq!((page.len(), cut), (2, true));
        let after = page[1].id.split_once('-').unwrap().1.to_string();
        let (rest, cut) = n.list(&[], None, Some(&after), None);
        assert_eq!((rest.len(), cut), (3, false));
        assert!(n.delete(&ids[0]) && !n.delete(&ids[0]));
        assert_eq!(n.sandbox_count(), 4);
        assert_eq!(n.load().memory_reserved_mb, 4 * 256);
        assert!(n.get(&ids[1]).is_some() && n.get(&ids[0]).is_none());
    }

    #[tokio::test]
    async fn an_idempotency_key_gives_one_sandbox() {
        let n = node(8, 1 << 20);
        let (a, fresh_a) = n.create(req(&[], Some("k1"))).await.unwrap();
        let (b, fresh_b) = n.create(req(&[], Some("k1"))).await.unwrap();
        assert_eq!((a.id, fresh_a, fresh_b), (b.id, true, false));
        assert_eq!(n.sandbox_count(), 1);
    }

    #[tokio::test]
    async fn admission_refuses_with_retry_after() {
        let n = node(8, 600);
        n.create(req(&[], None)).await.unwrap();
        n.create(req(&[], None)).await.unwrap();
        let e = n.create(req(&[], None)).await.unwrap_err();
        assert_eq!((e.code, e.retry_after), (ErrorCode::Busy, Some(1)));
        let n = node(0, 1 << 20);
        assert_eq!(
            n.create(req(&[], None)).await.unwrap_err().code,
            ErrorCode::Busy
        );
        let bad = CreateSandboxRequest {
            memory_mb: Some(1),
            ..Default::default()
        };
        assert_eq!(
            n.create(bad).await.unwrap_err().code,
            ErrorCode::InvalidRequest
        );
    }
}
