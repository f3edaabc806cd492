//! Shipping trajectories off the node (`warrend --trajectory-store URL`).
//!
//! The [`Shipper`] owns what is shipped: for each sandbox, the last seq in the store and
//! since when newer entries wait. It runs on a thread of its own (the manager starts it, see
//! `manager/shipping.rs`) and reads committed entries back from the journal, so nothing it
//! does is on the path of a call: an exec answers once its entry is on the node's disk, and
//! the shipper follows.
//!
//! - A sandbox's new entries go in a **segment** once the oldest of them waited
//!   [`CUT_AFTER`] or they hold [`SEGMENT_BYTES`], whichever comes first (the format is
//!   `warren_blob::trajectory`'s). Outputs kept as blobs are uploaded before the segment
//!   that refers to them; one of [`UPLOAD_WHOLE_UNDER`] bytes or more is read from its file
//!   and sent a part at a time (an S3 multipart upload), so the shipper's memory does not
//!   grow with an output's size.
//! - Idempotent: a segment is named by its first and last seq, and readers skip seqs
//!   they gave already, so sending a segment again (after a failure, or a restart that
//!   forgot what was shipped) never duplicates an entry.
//! - Restarts: what was shipped is read back from the store's listing the first time a
//!   sandbox is seen (the largest last seq of its segments).
//! - Failures: any store error stops the pass and the next waits a backoff that doubles up
//!   to [`MAX_BACKOFF`]; entries stay in the journal meanwhile, so memory does not grow
//!   with an outage.
//! - Records: a sandbox's record and hostname (`sandbox.json`, what revive makes a new
//!   sandbox like) are written by its create before it answers (while it starts; a create
//!   whose record cannot be written fails) or by its fork (naming the parent, see
//!   `manager/shipping.rs`), before its first segment if the store has none (one written by
//!   the create or fork is kept), and again at the seal (the last record; a network policy
//!   changed meanwhile is also in the log, replayed in order).
//! - Deletion: the delete path asks for a [`Shipper::seal`] (everything left, then the
//!   seal object) before the local log goes, and waits for it a bounded time.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use warren_blob::trajectory::{self as shipped, ForkOrigin, SandboxRecord, SegmentHeader};
use warren_blob::{BlobError, BlobStore};
use warren_types::{SandboxId, SandboxInfo};

use crate::clock::now_ms;
use crate::metrics::shipping::ShipMetrics;
use crate::trajectory::{Journal, StoredEntry};

/// New entries wait at most this long for their segment (plus one [`TICK`]).
pub const CUT_AFTER: Duration = Duration::from_millis(500);
/// A segment is cut once its entries hold this many bytes (as the journal counts them).
pub const SEGMENT_BYTES: u64 = 256 << 10;
/// Most entries in one segment.
const SEGMENT_ENTRIES: usize = 2048;
/// How often the shipper looks at the journal.
pub const TICK: Duration = Duration::from_millis(100);
/// First wait after a failure; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Outputs this large or larger are uploaded from their files by parts, never read whole
/// (`warren_blob::put_file`): an upload holds at most `warren_blob::PART_BYTES`.
pub const UPLOAD_WHOLE_UNDER: u64 = 1 << 20;
/// Output digests remembered as uploaded (forgotten all at once past this: uploading one
/// again is harmless).
const SENT_BLOBS: usize = 16_384;

/// What the shipper knows of one sandbox.
#[derive(Debug, Default)]
struct Track {
    /// The last seq in the store; `None` until read from the store's listing.
    shipped: Option<u64>,
    /// The log's committed length when the last segment was cut.
    len_at_ship: u64,
    /// When entries past `shipped` were first seen.
    waiting_since: Option<Instant>,
    /// True once its record is in the store.
    recorded: bool,
}

/// A live sandbox as the shipper needs it: its record and hostname.
#[derive(Debug, Clone)]
pub struct Live {
    pub info: SandboxInfo,
    pub hostname: Option<String>,
    /// A fork's child: its parent and the parent's last entry at the fork.
    pub forked_from: Option<ForkOrigin>,
}

impl Live {
    fn record(&self) -> SandboxRecord {
        SandboxRecord {
            format: shipped::RECORD_FORMAT,
            sandbox: self.info.clone(),
            hostname: self.hostname.clone(),
            forked_from: self.forked_from.clone(),
        }
    }
}

/// A sandbox to seal: ship the rest of its log, then its seal.
struct SealJob {
    id: SandboxId,
    live: Live,
    done: oneshot::Sender<Result<u64, ShipError>>,
}

#[derive(Default)]
struct State {
    tracks: HashMap<SandboxId, Track>,
    sent_blobs: HashSet<String>,
    backoff: Duration,
    retry_at: Option<Instant>,
}

/// The node's trajectory shipper; see the module docs.
pub struct Shipper {
    store: Arc<dyn BlobStore>,
    state: Mutex<State>,
    seals: Mutex<Vec<SealJob>>,
    wake: Notify,
    metrics: ShipMetrics,
}

impl std::fmt::Debug for Shipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shipper")
            .field("store", &self.store.describe())
            .finish()
    }
}

/// Why shipping or sealing a trajectory failed (the shipper retries a pass with backoff; a
/// seal that fails is a warning of the delete).
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// The trajectory store failed a listing or a write.
    #[error("trajectory store: {0}")]
    Store(#[from] warren_blob::BlobError),
    /// The node's journal could not be read.
    #[error("reading the journal: {0}")]
    Journal(#[from] crate::error::StoreError),
    /// A record could not be encoded.
    #[error("encoding the {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The shipper's thread went away before the seal was done.
    #[error("the trajectory shipper stopped")]
    Stopped,
}

impl ShipError {
    /// A stable name of the failure (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            ShipError::Store(_) => "store",
            ShipError::Journal(_) => "journal",
            ShipError::Encode { .. } => "encode",
            ShipError::Stopped => "stopped",
        }
    }
}

fn encode<T: serde::Serialize>(what: &'static str, v: &T) -> Result<Vec<u8>, ShipError> {
    serde_json::to_vec(v).map_err(|source| ShipError::Encode { what, source })
}

impl Shipper {
    pub fn new(store: Arc<dyn BlobStore>) -> Arc<Shipper> {
        Self::with_metrics(store, ShipMetrics::default())
    }

    /// A shipper that counts what it does in `metrics` (the node's, for `/metrics`).
    pub fn with_metrics(store: Arc<dyn BlobStore>, metrics: ShipMetrics) -> Arc<Shipper> {
        Arc::new(Shipper {
            store,
            state: Mutex::new(State::default()),
            seals: Mutex::new(Vec::new()),
            wake: Notify::new(),
            metrics,
        })
    }

    /// What it counts.
    pub fn metrics(&self) -> &ShipMetrics {
        &self.metrics
    }

    /// The store shipped to (and read from once a sandbox is not on the node).
    pub fn store(&self) -> &Arc<dyn BlobStore> {
        &self.store
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("shipper lock")
    }

    /// Asks for `id` to be sealed (its log is closed: nothing more is appended) and waits
    /// for it; answers the last seq shipped. `live` is its last record.
    pub async fn seal(&self, id: &SandboxId, live: Live) -> Result<u64, ShipError> {
        let (done, rx) = oneshot::channel();
        self.seals.lock().expect("shipper lock").push(SealJob {
            id: id.clone(),
            live,
            done,
        });
        self.wake.notify_one();
        rx.await.unwrap_or(Err(ShipError::Stopped))
    }

    /// Waits until a seal is asked for or `TICK` passed.
    pub async fn idle(&self) {
        let _ = tokio::time::timeout(TICK, self.wake.notified()).await;
    }

    /// One pass: seals asked for, then every live sandbox whose new entries are due.
    /// `live_of` says whether a sandbox is live on the node, and its record.
    pub async fn pass(&self, journal: &Journal, live_of: impl Fn(&SandboxId) -> Option<Live>) {
        let seals = std::mem::take(&mut *self.seals.lock().expect("shipper lock"));
        for job in seals {
            let r = self.seal_now(journal, &job.id, &job.live).await;
            if let Err(e) = &r {
                self.metrics.errors.inc();
                tracing::warn!(sandbox = %job.id, error = %e, kind = e.kind(), "cannot seal the shipped trajectory");
            }
            let _ = job.done.send(r);
        }
        if self.lock().retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let logs = match journal.read().and_then(|r| r.logs()) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "trajectory shipper cannot read the journal");
                return;
            }
        };
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut st = self.lock();
            let live: HashSet<&SandboxId> = logs.iter().map(|(id, _, _)| id).collect();
            st.tracks.retain(|id, _| live.contains(id));
            let mut backlog = 0;
            for (id, len, last) in &logs {
                // A log started ahead of its first entry has nothing to ship yet.
                if *last == 0 {
                    continue;
                }
                let Some(live) = live_of(id) else {
                    continue;
                };
                let t = st.tracks.entry(id.clone()).or_default();
                // Unknown until the store's listing was read: counted whole meanwhile.
                backlog += last.saturating_sub(t.shipped.unwrap_or(0));
                if t.shipped.is_some_and(|s| s >= *last) {
                    continue;
                }
                let since = *t.waiting_since.get_or_insert(now);
                if now.duration_since(since) >= CUT_AFTER
                    || len.saturating_sub(t.len_at_ship) >= SEGMENT_BYTES
                    || t.shipped.is_none()
                {
                    due.push((id.clone(), live, *len));
                }
            }
            self.metrics
                .backlog
                .set(i64::try_from(backlog).unwrap_or(i64::MAX));
        }
        for (id, live, len) in due {
            match self.ship(journal, &id, &live).await {
                Ok(_) => {
                    let mut st = self.lock();
                    st.backoff = Duration::ZERO;
                    st.retry_at = None;
                    if let Some(t) = st.tracks.get_mut(&id) {
                        t.len_at_ship = len;
                        t.waiting_since = None;
                    }
                }
                Err(e) => {
                    self.metrics.errors.inc();
                    let mut st = self.lock();
                    st.backoff = (st.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                    st.retry_at = Some(Instant::now() + st.backoff);
                    tracing::warn!(sandbox = %id, error = %e, kind = e.kind(), retry_in_ms = st.backoff.as_millis() as u64, "cannot ship a trajectory segment");
                    return;
                }
            }
        }
    }

    /// The last seq of `id` in the store: known, or read from the store's listing.
    async fn shipped(&self, id: &SandboxId) -> Result<u64, ShipError> {
        if let Some(s) = self.lock().tracks.get(id).and_then(|t| t.shipped) {
            return Ok(s);
        }
        let s = shipped::last_shipped(self.store.as_ref(), id).await?;
        self.lock().tracks.entry(id.clone()).or_default().shipped = Some(s);
        Ok(s)
    }

    /// Writes the record of `id` (idempotent: the same object again). A create writes it
    /// before it answers (see `manager/create.rs`), so a sandbox whose creation was answered
    /// can be revived from the store even when its node died before its first segment.
    pub(crate) async fn record(&self, id: &SandboxId, live: &Live) -> Result<(), ShipError> {
        let bytes = encode("sandbox record", &live.record())?;
        self.store
            .put(&shipped::record_key(id), bytes.into())
            .await?;
        self.lock().tracks.entry(id.clone()).or_default().recorded = true;
        Ok(())
    }

    /// Ships every committed entry of `id` past what the store holds, in segments (its
    /// record first, when the store has none); answers the last seq shipped. Called by the
    /// shipper's passes and by a fork (the parent's log up to the fork, before it answers):
    /// a segment both send is only sent twice, which readers ignore.
    pub(crate) async fn ship(
        &self,
        journal: &Journal,
        id: &SandboxId,
        live: &Live,
    ) -> Result<u64, ShipError> {
        let tenant = &live.info.tenant;
        let mut last = self.shipped(id).await?;
        if !self.lock().tracks.get(id).is_some_and(|t| t.recorded) {
            // The record its create or fork wrote stays: a fork's names the parent.
            match self.store.head(&shipped::record_key(id)).await {
                Ok(_) => self.lock().tracks.entry(id.clone()).or_default().recorded = true,
                Err(BlobError::NotFound(_)) => self.record(id, live).await?,
                Err(e) => return Err(e.into()),
            }
        }
        loop {
            let (entries, blobs, more) = journal.read().and_then(|r| {
                r.entries_loading(
                    id,
                    last + 1,
                    SEGMENT_ENTRIES,
                    SEGMENT_BYTES,
                    UPLOAD_WHOLE_UNDER,
                )
            })?;
            let (Some(first), Some(end)) = (entries.first(), entries.last()) else {
                return Ok(last);
            };
            let (first, end) = (first.seq, end.seq);
            for e in &entries {
                for d in e.blob_refs() {
                    if self.lock().sent_blobs.contains(d) {
                        continue;
                    }
                    match blobs.get(d) {
                        Some(bytes) => {
                            self.store
                                .put(&shipped::output_key(d), bytes.clone())
                                .await?
                        }
                        None => self.upload_large(journal, d).await?,
                    }
                    let mut st = self.lock();
                    if st.sent_blobs.len() >= SENT_BLOBS {
                        st.sent_blobs.clear();
                    }
                    st.sent_blobs.insert(d.to_string());
                }
            }
            let header = SegmentHeader {
                format: shipped::FORMAT,
                sandbox: id.to_string(),
                tenant: tenant.clone(),
                first_seq: first,
                last_seq: end,
            };
            let lines: Vec<_> = entries.iter().map(StoredEntry::shipped).collect();
            let segment = shipped::encode_segment(&header, &lines);
            let size = segment.len() as u64;
            self.store
                .put(&shipped::segment_key(id, first, end), segment)
                .await?;
            let oldest = entries.iter().map(|e| e.ended_at_ms).min().unwrap_or(0);
            self.metrics
                .shipped(size, Duration::from_millis(now_ms().saturating_sub(oldest)));
            last = end;
            if let Some(t) = self.lock().tracks.get_mut(id) {
                t.shipped = Some(end);
            }
            if !more {
                return Ok(last);
            }
        }
    }

    /// Uploads output blob `d` of [`UPLOAD_WHOLE_UNDER`] bytes or more from its file, a
    /// part at a time ([`warren_blob::put_file`]). One kept in the state file by an older
    /// node is read whole; one gone meanwhile (its sandbox deleted) is skipped, as a blob
    /// missing from the journal always was.
    async fn upload_large(&self, journal: &Journal, d: &str) -> Result<(), ShipError> {
        let key = shipped::output_key(d);
        if let Some(file) = journal.open_blob(d)? {
            warren_blob::put_file(self.store.as_ref(), &key, file).await?;
            return Ok(());
        }
        let legacy = journal.read()?.blob(d)?;
        if let Some(bytes) = legacy {
            self.store.put(&key, bytes).await?;
        }
        Ok(())
    }

    async fn seal_now(
        &self,
        journal: &Journal,
        id: &SandboxId,
        live: &Live,
    ) -> Result<u64, ShipError> {
        let last = self.ship(journal, id, live).await?;
        // The last record (the first one is in the store since the first segment).
        self.record(id, live).await?;
        let tenant = live.info.tenant.clone();
        let seal = shipped::Seal {
            format: shipped::FORMAT,
            sandbox: id.to_string(),
            tenant,
            last_seq: last,
            sealed_at_ms: now_ms(),
        };
        let bytes = encode("seal", &seal)?;
        self.store.put(&shipped::seal_key(id), bytes.into()).await?;
        self.lock().tracks.remove(id);
        Ok(last)
    }
}

/// A live sandbox of `tenant` (tests).
#[cfg(test)]
pub(crate) fn test_live(id: &SandboxId, tenant: &str) -> Live {
    Live {
        info: SandboxInfo {
            tenant: Some(tenant.into()),
            ..crate::store::test_info(id)
        },
        hostname: Some("h".into()),
        forked_from: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trajectory::{flood_entry, SandboxLog};
    use warren_blob::trajectory::TrajectoryPages;
    use warren_types::{Caller, NodeId};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ships_in_segments_resends_harmlessly_and_seals() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let remote: Arc<dyn BlobStore> =
            Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let log = SandboxLog::empty(&id);
        for i in 1..=5 {
            log.append(node.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
        let live = test_live(&id, "t1");
        let tenant = |_: &SandboxId| Some(live.clone());
        let shipper = Shipper::new(remote.clone());
        // First sight: shipped at once (nothing known of the store yet).
        shipper.pass(node.journal(), tenant).await;
        let read = || async {
            TrajectoryPages::open(remote.clone(), &id, 1, &Caller::admin())
                .await
                .unwrap()
                .all()
                .await
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(read().await, [1, 2, 3, 4, 5]);
        for i in 6..=7 {
            log.append(node.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
        // Not due yet: the entries wait for their segment.
        shipper.pass(node.journal(), tenant).await;
        assert_eq!(read().await.len(), 5);
        tokio::time::sleep(CUT_AFTER).await;
        shipper.pass(node.journal(), tenant).await;
        assert_eq!(read().await, [1, 2, 3, 4, 5, 6, 7]);
        // A restarted shipper that forgot everything, and one that sends all again.
        let again = Shipper::new(remote.clone());
        again.lock().tracks.entry(id.clone()).or_default().shipped = Some(0);
        again.ship(node.journal(), &id, &live).await.unwrap();
        let fresh = Shipper::new(remote.clone());
        assert_eq!(fresh.shipped(&id).await.unwrap(), 7);
        assert_eq!(read().await, [1, 2, 3, 4, 5, 6, 7], "no entry twice");
        log.append(node.journal(), flood_entry(8), None, Vec::new())
            .await
            .unwrap();
        let sealing = {
            let (fresh, id) = (fresh.clone(), id.clone());
            let live = live.clone();
            tokio::spawn(async move { fresh.seal(&id, live).await })
        };
        while !sealing.is_finished() {
            fresh.pass(node.journal(), |_| None).await;
            tokio::task::yield_now().await;
        }
        assert_eq!(sealing.await.unwrap().unwrap(), 8);
        assert_eq!(read().await, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(remote
            .list(&shipped::sandbox_prefix(&id))
            .await
            .unwrap()
            .contains(&shipped::seal_key(&id)));
    }

    /// An output larger than a part is uploaded from its file a part at a time: the store
    /// is never handed more than `PART_BYTES` at once (the whole output was, read from the
    /// journal in one piece), and it holds the output byte for byte, before the segment that
    /// names it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_output_is_uploaded_a_part_at_a_time() {
        use crate::trajectory::{Room, StoredExec, StoredResult};
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let largest = Arc::new(warren_blob::testing::LargestHanded::new(
            warren_blob::LocalStore::new(dir.path().join("remote")),
        ));
        let remote: Arc<dyn BlobStore> = largest.clone();
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let log = SandboxLog::empty(&id);
        let out: Vec<u8> = (0..warren_blob::PART_BYTES * 5 / 2)
            .map(|i| (i % 251) as u8)
            .collect();
        let mut blobs = Vec::new();
        let mut e = flood_entry(1);
        let exit = warren_types::ExitInfo {
            exit_code: Some(0),
            stdout_bytes: out.len() as u64,
            ..Default::default()
        };
        let exec = StoredExec::new(exit, &out, b"", &mut Room::unlimited(), &mut blobs);
        let digest = exec.stdout.sha256.clone();
        assert!(exec.stdout.in_blob());
        e.result = Some(StoredResult::Exec(exec));
        log.append(node.journal(), e, None, blobs).await.unwrap();
        let live = test_live(&id, "t1");
        let shipper = Shipper::new(remote.clone());
        shipper.pass(node.journal(), |_| Some(live.clone())).await;
        assert_eq!(shipper.metrics().errors.get(), 0);
        assert!(remote.head(&shipped::segment_key(&id, 1, 1)).await.is_ok());
        let stored = remote.get(&shipped::output_key(&digest)).await.unwrap();
        assert!(stored == out, "the output in the store differs");
        let most = largest.most();
        assert!(
            most <= warren_blob::PART_BYTES,
            "the store was handed {most} bytes at once for a {} byte output",
            out.len()
        );
    }

    /// Revive reads what an entry was fed, never its outputs: a page of a shipped log holds
    /// the input's blob only, also when the output's blob is not in the store at all, and
    /// so does a page of the node's own log.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_revive_page_reads_inputs_not_outputs() {
        use crate::trajectory::{
            LogSource, Room, StoreLogSource, StoredExec, StoredOutput, StoredResult,
        };
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let remote: Arc<dyn BlobStore> =
            Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let log = SandboxLog::empty(&id);
        let out = vec![b'o'; 3 << 20];
        let stdin = vec![b'i'; 64 << 10];
        let mut blobs = Vec::new();
        let mut e = flood_entry(1);
        e.input = Some(StoredOutput::new(&stdin, &mut blobs));
        let exec = StoredExec::new(
            warren_types::ExitInfo::default(),
            &out,
            b"",
            &mut Room::unlimited(),
            &mut blobs,
        );
        let output = exec.stdout.sha256.clone();
        e.result = Some(StoredResult::Exec(exec));
        let input = e.input_ref().unwrap().to_string();
        log.append(node.journal(), e, None, blobs).await.unwrap();
        let (entries, local, _) = node
            .journal()
            .read()
            .unwrap()
            .entries_with_inputs(&id, 1, 10, 16 << 20)
            .unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(local.keys().collect::<Vec<_>>(), [&input]);
        let live = test_live(&id, "t1");
        Shipper::new(remote.clone())
            .pass(node.journal(), |_| Some(live.clone()))
            .await;
        remote.head(&shipped::output_key(&output)).await.unwrap();
        std::fs::remove_file(dir.path().join("remote").join(shipped::output_key(&output))).unwrap();
        let page = StoreLogSource::new(remote.clone())
            .page(&id, 1, 10)
            .await
            .unwrap();
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.blobs.keys().collect::<Vec<_>>(), [&input]);
        assert_eq!(page.blobs[&input], stdin);
    }

    /// Segments, their bytes and lag, the backlog and store errors are counted (what
    /// `/metrics` shows as `warren_trajectory_ship*`).
    #[tokio::test]
    async fn counts_segments_bytes_backlog_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let node = crate::Store::open(dir.path().join("state.redb")).unwrap();
        let remote: Arc<dyn BlobStore> =
            Arc::new(warren_blob::LocalStore::new(dir.path().join("remote")));
        let id = SandboxId::generate(&"n1".parse::<NodeId>().unwrap());
        let log = SandboxLog::empty(&id);
        for i in 1..=3 {
            log.append(node.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
        let live = test_live(&id, "t1");
        let shipper = Shipper::new(remote.clone());
        let m = shipper.metrics().clone();
        shipper.pass(node.journal(), |_| Some(live.clone())).await;
        assert_eq!(m.segments.get(), 1);
        let size = remote
            .get(&shipped::segment_key(&id, 1, 3))
            .await
            .unwrap()
            .len() as u64;
        assert_eq!(m.bytes.get(), size);
        assert_eq!(m.errors.get(), 0);
        let mut reg = crate::metrics::Registry::default();
        m.register(&mut reg);
        let text = crate::metrics::encode(&reg);
        assert!(
            text.contains("warren_trajectory_ship_lag_seconds_count 1"),
            "{text}"
        );
        for i in 4..=5 {
            log.append(node.journal(), flood_entry(i), None, Vec::new())
                .await
                .unwrap();
        }
        // Not due yet: two entries wait.
        shipper.pass(node.journal(), |_| Some(live.clone())).await;
        assert_eq!(m.backlog.get(), 2);
        // The store fails (its directory is a file now): an error, and the backlog stays.
        std::fs::remove_dir_all(dir.path().join("remote")).unwrap();
        std::fs::write(dir.path().join("remote"), b"not a directory").unwrap();
        tokio::time::sleep(CUT_AFTER).await;
        shipper.pass(node.journal(), |_| Some(live.clone())).await;
        assert_eq!(m.errors.get(), 1);
        assert_eq!(m.segments.get(), 1);
        assert_eq!(m.backlog.get(), 2);
    }
}
