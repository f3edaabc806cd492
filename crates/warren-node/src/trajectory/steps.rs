//! One sandbox's log in memory: the next sequence number, the highest logged step, and the
//! steps running now.
//!
//! A call that names a step first [`SandboxLog::claim`]s it:
//! - logged already → [`Claim::Logged`] (the caller compares digests and answers the record);
//! - running now → [`Claim::Wait`] (the caller waits for that run's answer, never runs again);
//! - new and above every step claimed so far → [`Claim::Run`] with a [`StepGuard`];
//! - otherwise → `step_conflict` (the log is append-only: a step may not go back in time).
//!
//! The guard's owner appends its entry (durably) and then [`StepGuard::finish`]es, which
//! hands the entry to every waiter (each reads its answer from it as a logged step's). A guard dropped without finishing releases the step,
//! and waiters claim it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use warren_types::SandboxId;

use super::journal::{Append, Journal, LoggedStep};
use super::{Blob, Digest, Recorded, StoredEntry};
use crate::error::{NodeError, StoreError};

/// How a running step ended, as its waiters see it.
#[derive(Debug, Clone)]
pub enum Finished {
    Done {
        digest: Digest,
        record: Arc<Recorded>,
    },
    /// The run stopped before it reached the sandbox; claim the step again.
    Released,
}

type Slot = watch::Receiver<Option<Finished>>;

struct Running {
    /// Known up front for everything but file writes (whose content digest comes at the end).
    digest: Option<Digest>,
    done: Slot,
}

struct State {
    next_seq: u64,
    max_logged_step: Option<u64>,
    running: HashMap<u64, Running>,
    /// The sandbox is being deleted: nothing more is appended.
    closed: bool,
    /// Bytes the log holds (entries plus output in blobs), against the sandbox's budget.
    stored: u64,
}

/// A sandbox's trajectory state in memory.
pub struct SandboxLog {
    id: SandboxId,
    state: Mutex<State>,
}

impl std::fmt::Debug for SandboxLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxLog").field("id", &self.id).finish()
    }
}

/// What a step claim found.
pub enum Claim {
    /// The step is logged (its entry's seq, request digest and place in the log).
    Logged(LoggedStep),
    /// Another call is running the step; wait for its answer.
    Wait(Slot),
    /// This call runs the step.
    Run(StepGuard),
}

/// The right to run one step; see the module docs.
pub struct StepGuard {
    log: Arc<SandboxLog>,
    step: u64,
    tx: Option<watch::Sender<Option<Finished>>>,
}

impl std::fmt::Debug for StepGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepGuard")
            .field("step", &self.step)
            .finish()
    }
}

impl StepGuard {
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Hands the step's entry to every waiter. Call after it is committed.
    pub fn finish(mut self, digest: Digest, record: Arc<Recorded>) {
        self.end(Finished::Done { digest, record });
    }

    fn end(&mut self, how: Finished) {
        let Some(tx) = self.tx.take() else { return };
        self.log.lock().running.remove(&self.step);
        let _ = tx.send(Some(how));
    }
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        self.end(Finished::Released);
    }
}

/// The error of a step whose request differs from the logged one (or comes too late).
pub fn conflict(id: &SandboxId, step: u64, why: &str) -> NodeError {
    NodeError::StepConflict {
        id: id.clone(),
        step,
        why: why.to_string(),
    }
}

impl SandboxLog {
    /// The log of `id`, continuing from what `journal` holds for it.
    pub fn open(journal: &Journal, id: &SandboxId) -> Result<Arc<SandboxLog>, StoreError> {
        let read = journal.read()?;
        let (last_seq, max_step) = read.tail(id)?;
        let stored = read.stored_bytes(id)?;
        Ok(Arc::new(SandboxLog {
            id: id.clone(),
            state: Mutex::new(State {
                next_seq: last_seq + 1,
                max_logged_step: max_step,
                running: HashMap::new(),
                closed: false,
                stored,
            }),
        }))
    }

    /// A log with nothing in it (a sandbox just made).
    pub fn empty(id: &SandboxId) -> Arc<SandboxLog> {
        Arc::new(SandboxLog {
            id: id.clone(),
            state: Mutex::new(State {
                next_seq: 1,
                max_logged_step: None,
                running: HashMap::new(),
                closed: false,
                stored: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("trajectory lock")
    }

    /// Stops appends (the sandbox is being deleted) and waits for those already queued, so
    /// that deleting the trajectory after this leaves nothing behind.
    pub async fn close(&self, journal: &Journal) -> Result<(), StoreError> {
        self.lock().closed = true;
        journal.barrier().await
    }

    /// Lets appends go on again (a delete that failed).
    pub fn reopen(&self) {
        self.lock().closed = false;
    }

    /// Bytes the log holds against the sandbox's trajectory budget.
    pub fn stored_bytes(&self) -> u64 {
        self.lock().stored
    }

    /// The last sequence number given out (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// Claims `step` for a request with `digest` (`None` when it is only known at the end).
    pub fn claim(
        self: &Arc<Self>,
        journal: &Journal,
        step: u64,
        digest: Option<Digest>,
    ) -> Result<Claim, NodeError> {
        let mut st = self.lock();
        if let Some(r) = st.running.get(&step) {
            if let (Some(a), Some(b)) = (r.digest, digest) {
                if a != b {
                    return Err(conflict(
                        &self.id,
                        step,
                        "it is running now with a different request",
                    ));
                }
            }
            return Ok(Claim::Wait(r.done.clone()));
        }
        if let Some(logged) = journal.read()?.step(&self.id, step)? {
            return Ok(Claim::Logged(logged));
        }
        let highest = st.running.keys().copied().chain(st.max_logged_step).max();
        if let Some(h) = highest {
            if step <= h {
                return Err(conflict(
                    &self.id,
                    step,
                    &format!("step {h} is already logged or running, and steps only go forward"),
                ));
            }
        }
        let (tx, rx) = watch::channel(None);
        st.running.insert(step, Running { digest, done: rx });
        Ok(Claim::Run(StepGuard {
            log: self.clone(),
            step,
            tx: Some(tx),
        }))
    }

    /// Appends `entry` (its `seq` is set here) and waits until it is on disk. Returns the seq,
    /// or 0 when the log is closed (the sandbox is being deleted; nothing is written).
    pub async fn append(
        &self,
        journal: &Journal,
        mut entry: StoredEntry,
        step_digest: Option<Digest>,
        blobs: Vec<Blob>,
    ) -> Result<u64, StoreError> {
        let step = entry.step;
        let (seq, rx) = {
            let mut st = self.lock();
            if st.closed {
                return Ok(0);
            }
            let seq = st.next_seq;
            entry.seq = seq;
            let bytes = entry.encode().map_err(|source| StoreError::Encode {
                what: "trajectory entry",
                source,
            })?;
            st.stored += entry.budget_bytes(bytes.len());
            let rx = journal.queue(Append {
                sandbox: self.id.clone(),
                seq,
                step: step.zip(step_digest),
                entry: bytes,
                blobs,
            })?;
            // Queued under the lock: the writer commits in seq order.
            st.next_seq += 1;
            (seq, rx)
        };
        journal.committed(rx).await?;
        if let Some(s) = step {
            let mut st = self.lock();
            st.max_logged_step = st.max_logged_step.max(Some(s));
        }
        Ok(seq)
    }
}

/// Waits for a running step's entry; `None` when it was released.
pub async fn wait(mut slot: Slot) -> Option<(Digest, Arc<Recorded>)> {
    let finished = match slot.wait_for(|v| v.is_some()).await {
        Ok(v) => v.clone(),
        // The sender went away without a word: treat as released.
        Err(_) => return None,
    };
    match finished {
        Some(Finished::Done { digest, record }) => Some((digest, record)),
        _ => None,
    }
}
