//! The step runner: every call that changes a sandbox (exec, streamed exec, spawn, kill, file
//! writes, mkdir, remove, chmod) goes through here, runs at most once per step and is logged
//! durably before it answers.
//!
//! [`Manager::begin`] claims the call's step: a logged step (or one that finishes while this
//! call waits for it) comes back as a [`Replay`], which answers the record after comparing
//! request digests; otherwise the call gets a [`Run`], which readies the sandbox, and
//! [`Run::finish`]es (logs the outcome and hands it to the step's waiters) or is
//! [`Run::cancel`]led (logged as cancelled). The answer is typed by the call's
//! [`CallKind`]: [`Exec`](crate::trajectory::Exec) answers an `ExecResult`,
//! [`Spawn`](crate::trajectory::Spawn) a `ProcessInfo`, [`Effect`](crate::trajectory::Effect)
//! nothing.
//!
//! [`Manager::logged`] is the whole sequence for calls that are one future: a call without a
//! step is logged as cancelled if its caller goes away first; a call with a step runs in its
//! own task, so that it finishes and is logged even if the caller goes away — the caller's
//! retry then finds it. Streamed execs and uploads drive their [`Run`] themselves.

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;
use tracing::warn;
use warren_proto::Hold;
use warren_runtime::Instance;
use warren_types::{ApiError, ExecCall, ExecRequest, SandboxId, SandboxInfo, TrajectoryCall};

use super::{now_ms, ActivityGuard, Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::Metrics;
use crate::trajectory::steps::{self, conflict};
use crate::trajectory::{
    hex, request_digest, sha256, Blob, CallKind, Claim, Digest, Recorded, Room, StepGuard,
    StoredEntry, StoredOutput,
};

/// What a call was fed (an upload's content, an exec's stdin), logged with it under the
/// sandbox's budget so that revive can feed it again.
#[derive(Debug, Clone)]
pub(crate) enum Fed {
    /// All of it.
    Kept(bytes::Bytes),
    /// Too much to keep: its digest and size only.
    Dropped { sha256: String, len: u64 },
}

impl Fed {
    fn stored(self, room: &mut Room, blobs: &mut Vec<Blob>) -> StoredOutput {
        match self {
            Fed::Kept(b) => StoredOutput::kept_if(room.keep(b.len()), &b, blobs),
            Fed::Dropped { sha256, len } => StoredOutput {
                sha256,
                len,
                inline: None,
                omitted: true,
            },
        }
    }
}

/// A logged call's answer, and whether it came from the log.
#[derive(Debug)]
pub(crate) struct Answered<T> {
    pub answer: T,
    pub replayed: bool,
}

/// An exec request as logged.
pub(crate) fn exec_call(req: &ExecRequest, streamed: bool) -> ExecCall {
    // Validated before: the encoding is good.
    let stdin = req.stdin_bytes().ok().flatten();
    ExecCall {
        argv: req.argv.clone(),
        shell: req.shell.clone(),
        cwd: req.cwd.clone(),
        env: req.env.clone(),
        user: req.user.clone(),
        timeout_secs: req.timeout_secs,
        max_output_bytes: req.max_output_bytes,
        encoding: req.encoding,
        stdin_sha256: stdin.as_ref().map(|s| hex(&sha256(s))),
        stdin_bytes: stdin.as_ref().map_or(0, |s| s.len() as u64),
        streamed,
        kill_tree: req.kill_tree,
    }
}

/// What the agent holds with a step's command (see [`warren_proto::Hold`]): the logged
/// request and when the run started, so that a restarted daemon can log the held result as
/// the step's entry.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HoldNote {
    pub call: TrajectoryCall,
    pub started_ms: u64,
}

/// The hold of a foreground command logged as `call` for `step` (none without a step).
pub(crate) fn hold(step: Option<u64>, call: &TrajectoryCall) -> Option<Hold> {
    let step = step?;
    let note = HoldNote {
        call: call.clone(),
        started_ms: now_ms(),
    };
    Some(Hold {
        step,
        note: serde_json::to_string(&note).ok()?,
    })
}

/// What claiming a call's step came to.
pub(crate) enum Begun<K> {
    /// The step was answered before (logged, or by the run this call waited for).
    Replay(Replay<K>),
    /// This call runs.
    Run(Run<K>),
}

/// A step answered before: its record and the digest of the request it answered.
pub(crate) struct Replay<K> {
    manager: Manager,
    id: SandboxId,
    step: u64,
    digest: Digest,
    record: Arc<Recorded>,
    kind: PhantomData<fn() -> K>,
}

impl<K: CallKind> Replay<K> {
    /// The recorded answer for a request with digest `own`; `step_conflict` when the
    /// request differs.
    pub(crate) fn answer(self, own: &Digest) -> Result<K::Answer, NodeError> {
        let metrics = &self.manager.inner.parts.telemetry.metrics();
        if *own != self.digest {
            Metrics::inc(&metrics.step_conflicts);
            return Err(conflict(
                &self.id,
                self.step,
                "it was logged with a different request",
            ));
        }
        Metrics::inc(&metrics.replays);
        let Recorded { entry, blobs } = &*self.record;
        if let Some(e) = &entry.error {
            return Err(NodeError::Api(e.clone()));
        }
        K::replay(entry, blobs).map_err(NodeError::Api)
    }
}

/// One logged call on its way: ready the sandbox, run, then finish or cancel.
pub(crate) struct Run<K> {
    manager: Manager,
    sandbox: Arc<Sandbox>,
    guard: Option<StepGuard>,
    started_ms: u64,
    input: Option<Fed>,
    /// The digest of the call it will log, when its caller computed it already (to claim
    /// the step): hashing a request costs as much as a small exec's other daemon work.
    digest: Option<Digest>,
    kind: PhantomData<fn() -> K>,
}

impl<K: CallKind> Run<K> {
    /// The digest of the call this run will log (computed by its caller from that same
    /// call), so it is not computed again when the call is logged.
    pub(crate) fn digested(&mut self, digest: Digest) {
        self.digest = Some(digest);
    }

    /// Logs `input` as what the call was fed.
    pub(crate) fn feed(&mut self, input: Option<Fed>) {
        self.input = input;
    }

    /// Bytes the sandbox's log may still keep (what an upload may hold on to for it).
    pub(crate) fn room_left(&self) -> u64 {
        let budget = self.sandbox.lock().info.limits.trajectory_mb << 20;
        budget.saturating_sub(self.sandbox.log.stored_bytes())
    }

    fn room(&self) -> Room {
        let state_full =
            self.manager.journal().state_bytes() >= self.manager.config().state_max_bytes;
        Room::new(self.room_left(), state_full)
    }

    /// The run started at `ms` (a held command's, collected after a daemon restart).
    pub(crate) fn started_at(&mut self, ms: u64) {
        self.started_ms = ms;
    }

    /// True when the call names a step: it then runs to its end even without a caller.
    pub(crate) fn runs_to_end(&self) -> bool {
        self.guard.is_some()
    }

    /// Readies the sandbox (resuming it when paused); the call's run starts now. Failing
    /// here (deleted, lost) runs nothing, logs nothing, and frees the step.
    pub(crate) async fn ready(
        &mut self,
    ) -> Result<(Arc<dyn Instance>, SandboxInfo, ActivityGuard), NodeError> {
        self.ready_within(None).await
    }

    /// [`Run::ready`] for a call with its own timeout: a sandbox still being created is
    /// waited for at most `limit`.
    pub(crate) async fn ready_within(
        &mut self,
        limit: Option<std::time::Duration>,
    ) -> Result<(Arc<dyn Instance>, SandboxInfo, ActivityGuard), NodeError> {
        let ready = self.manager.ready_within(&self.sandbox, limit).await?;
        self.started_ms = now_ms();
        Ok(ready)
    }

    /// Logs the call's outcome durably, then hands it to the step's waiters.
    pub(crate) async fn finish(
        mut self,
        call: TrajectoryCall,
        outcome: Result<K::Done, NodeError>,
    ) -> Result<K::Answer, NodeError> {
        // Input and output are kept while the sandbox's log is within its budget and the
        // node's state file within its limit; beyond, only digests and sizes.
        let mut room = self.room();
        let input = self.input.take();
        self.commit(call, |entry, blobs| {
            entry.input = input.map(|i| i.stored(&mut room, blobs));
            match outcome {
                Ok(done) => Ok(K::record(done, entry, &mut room, blobs)),
                Err(e) => {
                    entry.error = Some(e.to_api());
                    Err(e)
                }
            }
        })
        .await?
    }

    /// Logs a call that failed with `e`; answers `e` (or why it could not be logged).
    pub(crate) async fn fail(mut self, call: TrajectoryCall, e: NodeError) -> NodeError {
        let mut room = self.room();
        let input = self.input.take();
        let logged = self
            .commit(call, |entry, blobs| {
                entry.input = input.map(|i| i.stored(&mut room, blobs));
                entry.error = Some(e.to_api());
                e
            })
            .await;
        logged.unwrap_or_else(|log_error| log_error)
    }

    /// Appends the call's entry as `fill` completes it, then hands it to the step's waiters.
    async fn commit<R>(
        self,
        call: TrajectoryCall,
        fill: impl FnOnce(&mut StoredEntry, &mut Vec<Blob>) -> R,
    ) -> Result<R, NodeError> {
        let m = &self.manager;
        let step = self.guard.as_ref().map(StepGuard::step);
        let digest = match self.digest {
            Some(d) => {
                debug_assert!(d == request_digest(&call), "a run's digest is its call's");
                d
            }
            None => request_digest(&call),
        };
        // A step's foreground command was held by the agent until now (see `hold`).
        let held = step.filter(|_| matches!(call, TrajectoryCall::Exec(_)));
        let mut entry = StoredEntry::new(call, step, self.started_ms);
        let mut blobs = Vec::new();
        let filled = fill(&mut entry, &mut blobs);
        let t = std::time::Instant::now();
        let record = self.guard.is_some().then(|| Recorded {
            entry: entry.clone(),
            blobs: blobs.iter().cloned().collect(),
        });
        self.sandbox
            .log
            .append(m.journal(), entry, Some(digest), blobs)
            .await?;
        m.inner
            .parts
            .telemetry
            .metrics()
            .observe_append(t.elapsed());
        Metrics::inc(&m.inner.parts.telemetry.metrics().trajectory_appends);
        if let (Some(g), Some(record)) = (self.guard, record) {
            g.finish(digest, Arc::new(record));
        }
        if let Some(step) = held {
            let instance = self.sandbox.lock().instance.clone();
            if let Some(instance) = instance {
                let id = self.sandbox.id.clone();
                tokio::spawn(async move {
                    if let Err(e) = instance.agent().release(step).await {
                        tracing::debug!(sandbox = %id, step, error = %e, "cannot release a held step");
                    }
                });
            }
        }
        Ok(filled)
    }

    /// Logs a call its caller abandoned (it was stopped); frees the step.
    pub(crate) async fn cancel(self, call: TrajectoryCall) {
        self.manager
            .log_cancelled(&self.sandbox, call, self.started_ms)
            .await;
    }
}

/// Logs a call as cancelled if its future is dropped before it is disarmed.
struct CancelLog {
    armed: Option<(Manager, Arc<Sandbox>, TrajectoryCall, u64)>,
}

impl CancelLog {
    fn disarm(mut self) {
        self.armed = None;
    }
}

impl Drop for CancelLog {
    fn drop(&mut self) {
        let Some((m, sb, call, started_ms)) = self.armed.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { m.log_cancelled(&sb, call, started_ms).await });
        }
    }
}

impl Manager {
    /// Claims `step` of sandbox `id` for a call of kind `K` whose request has `digest`
    /// (`None` when it is only known at the end, as an upload's).
    pub(crate) async fn begin<K: CallKind>(
        &self,
        id: &SandboxId,
        step: Option<u64>,
        digest: Option<Digest>,
    ) -> Result<Begun<K>, NodeError> {
        let sb = self.lookup(id)?;
        let run = |guard| {
            Begun::Run(Run {
                manager: self.clone(),
                sandbox: sb.clone(),
                guard,
                started_ms: now_ms(),
                input: None,
                digest: None,
                kind: PhantomData,
            })
        };
        let Some(step) = step else {
            return Ok(run(None));
        };
        let replay = |digest, record| {
            Begun::Replay(Replay {
                manager: self.clone(),
                id: id.clone(),
                step,
                digest,
                record,
                kind: PhantomData,
            })
        };
        loop {
            let claim = sb
                .log
                .claim(self.journal(), step, digest)
                .inspect_err(|e| {
                    if matches!(e, NodeError::StepConflict { .. }) {
                        Metrics::inc(&self.inner.parts.telemetry.metrics().step_conflicts);
                    }
                })?;
            match claim {
                Claim::Logged(logged) => {
                    let found = self.journal().read()?.step_entry(&sb.id, &logged)?;
                    let (entry, blobs) = found.ok_or_else(|| {
                        NodeError::Api(ApiError::internal(format!(
                            "step {step} of sandbox {} is indexed but its entry {} is missing",
                            sb.id, logged.seq
                        )))
                    })?;
                    return Ok(replay(logged.digest, Arc::new(Recorded { entry, blobs })));
                }
                Claim::Wait(slot) => {
                    if let Some((digest, record)) = steps::wait(slot).await {
                        return Ok(replay(digest, record));
                    }
                    // Released without an answer: claim it again.
                }
                Claim::Run(g) => return Ok(run(Some(g))),
            }
        }
    }

    /// Runs `run` on the sandbox as `call`, at most once for `step`, and logs it.
    pub(crate) async fn logged<K, F, Fut>(
        &self,
        id: &SandboxId,
        step: Option<u64>,
        call: TrajectoryCall,
        run: F,
    ) -> Result<Answered<K::Answer>, NodeError>
    where
        K: CallKind,
        F: FnOnce(Arc<dyn Instance>, SandboxInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<K::Done, NodeError>> + Send + 'static,
    {
        self.logged_fed::<K, F, Fut>(id, step, call, None, run)
            .await
    }

    /// [`Manager::logged`] for a call fed `input` (logged with it).
    pub(crate) async fn logged_fed<K, F, Fut>(
        &self,
        id: &SandboxId,
        step: Option<u64>,
        call: TrajectoryCall,
        input: Option<Fed>,
        run: F,
    ) -> Result<Answered<K::Answer>, NodeError>
    where
        K: CallKind,
        F: FnOnce(Arc<dyn Instance>, SandboxInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<K::Done, NodeError>> + Send + 'static,
    {
        let digest = request_digest(&call);
        let limit = match &call {
            TrajectoryCall::Exec(c) | TrajectoryCall::Spawn(c) => c.timeout_secs,
            _ => None,
        }
        .map(std::time::Duration::from_secs_f64);
        let mut r = match self.begin::<K>(id, step, Some(digest)).await? {
            Begun::Replay(known) => {
                return Ok(Answered {
                    answer: known.answer(&digest)?,
                    replayed: true,
                })
            }
            Begun::Run(r) => r,
        };
        r.digested(digest);
        r.feed(input);
        let go = async move {
            let (instance, info, _busy) = r.ready_within(limit).await?;
            let cancel = CancelLog {
                armed: (!r.runs_to_end()).then(|| {
                    (
                        r.manager.clone(),
                        r.sandbox.clone(),
                        call.clone(),
                        r.started_ms,
                    )
                }),
            };
            let outcome = run(instance, info).await;
            cancel.disarm();
            r.finish(call, outcome).await
        };
        let answer = if step.is_some() {
            tokio::spawn(go).await.map_err(|e| {
                NodeError::Api(ApiError::internal(format!("the step's task failed: {e}")))
            })??
        } else {
            go.await?
        };
        Ok(Answered {
            answer,
            replayed: false,
        })
    }

    /// Logs a call its caller abandoned (it was stopped).
    async fn log_cancelled(&self, sb: &Sandbox, call: TrajectoryCall, started_ms: u64) {
        let mut entry = StoredEntry::new(call, None, started_ms);
        entry.cancelled = true;
        match sb.log.append(self.journal(), entry, None, Vec::new()).await {
            Ok(_) => Metrics::inc(&self.inner.parts.telemetry.metrics().trajectory_appends),
            Err(e) => warn!(sandbox = %sb.id, error = %e, "cannot log a cancelled call"),
        }
    }
}
