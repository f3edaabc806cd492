//! Calls that change a sandbox (exec, spawn, kill, file writes, mkdir, remove, chmod) go
//! through here: run once per step, logged durably before they answer.
//!
//! A call without a step runs as before and is logged when it ends; if its caller goes away
//! first, the call is stopped and logged as cancelled. A call with a step is looked up first:
//! a logged step answers its record (nothing runs), a running one is waited for, a new one
//! runs in its own task so that it finishes and is logged even if the caller goes away — the
//! caller's retry then finds it.

use std::future::Future;
use std::sync::Arc;
use tracing::warn;
use warren_runtime::{ExecOutput, Instance};
use warren_types::{
    ApiError, ExecCall, ExecRequest, OutputEncoding, ProcessInfo, SandboxId, SandboxInfo,
    TrajectoryCall,
};

use super::exec::exec_result;
use super::{now_ms, Manager, Sandbox};
use crate::error::NodeError;
use crate::metrics::Metrics;
use crate::trajectory::steps::{self, conflict};
use crate::trajectory::{
    hex, request_digest, sha256, Answer, Claim, Digest, StepGuard, StoredEntry, StoredExec,
    StoredOutput, StoredResult,
};

/// What a call did, for its entry.
pub(crate) enum Done {
    Exec(ExecOutput),
    Process(ProcessInfo),
    Unit,
}

/// A logged call's answer, and whether it came from the log.
#[derive(Debug)]
pub(crate) struct Logged {
    pub answer: Answer,
    pub replayed: bool,
}

/// What a step claim came to.
pub(crate) enum Step {
    /// Answered before (logged, or by the run this call waited for), for a request with
    /// `digest`.
    Known {
        digest: Digest,
        answer: Result<Answer, ApiError>,
    },
    /// This call runs; it holds the step when it names one.
    Run(Option<StepGuard>),
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
    /// Looks `step` up (nothing to do without one).
    pub(crate) async fn claim_step(
        &self,
        sb: &Arc<Sandbox>,
        step: Option<u64>,
        digest: Option<Digest>,
    ) -> Result<Step, NodeError> {
        let Some(step) = step else {
            return Ok(Step::Run(None));
        };
        loop {
            let claim = sb
                .log
                .claim(self.journal(), step, digest)
                .inspect_err(|e| {
                    if matches!(e, NodeError::StepConflict { .. }) {
                        Metrics::inc(&self.inner.metrics.step_conflicts);
                    }
                })?;
            match claim {
                Claim::Logged { seq, digest } => {
                    let found = self.journal().read()?.entry(&sb.id, seq)?;
                    let (entry, blobs) = found.ok_or_else(|| {
                        NodeError::Api(ApiError::internal(format!(
                            "step {step} of sandbox {} is indexed but its entry {seq} is missing",
                            sb.id
                        )))
                    })?;
                    return Ok(Step::Known {
                        digest,
                        answer: entry.answer(&blobs),
                    });
                }
                Claim::Wait(slot) => {
                    if let Some((digest, answer)) = steps::wait(slot).await {
                        return Ok(Step::Known { digest, answer });
                    }
                    // Released without an answer: claim it again.
                }
                Claim::Run(g) => return Ok(Step::Run(Some(g))),
            }
        }
    }

    /// The known answer for a request with digest `own`, marked replayed; `step_conflict`
    /// when the request differs.
    pub(crate) fn settle(
        &self,
        id: &SandboxId,
        step: u64,
        own: &Digest,
        known: &Digest,
        answer: Result<Answer, ApiError>,
    ) -> Result<Answer, NodeError> {
        if own != known {
            Metrics::inc(&self.inner.metrics.step_conflicts);
            return Err(conflict(id, step, "it was logged with a different request"));
        }
        Metrics::inc(&self.inner.metrics.replays);
        answer.map(Answer::replayed).map_err(NodeError::Api)
    }

    /// Runs `run` on the sandbox as `call`, at most once for `step`, and logs it.
    pub(crate) async fn logged<F, Fut>(
        &self,
        id: &SandboxId,
        step: Option<u64>,
        call: TrajectoryCall,
        run: F,
    ) -> Result<Logged, NodeError>
    where
        F: FnOnce(Arc<dyn Instance>, SandboxInfo) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Done, NodeError>> + Send + 'static,
    {
        let sb = self.lookup(id)?;
        let digest = request_digest(&call);
        match self.claim_step(&sb, step, Some(digest)).await? {
            Step::Known {
                digest: known,
                answer,
            } => Ok(Logged {
                answer: self.settle(id, step.unwrap_or(0), &digest, &known, answer)?,
                replayed: true,
            }),
            Step::Run(None) => Ok(Logged {
                answer: self.run_logged(sb, None, call, run).await?,
                replayed: false,
            }),
            Step::Run(Some(guard)) => {
                let m = self.clone();
                let task =
                    tokio::spawn(async move { m.run_logged(sb, Some(guard), call, run).await });
                let answer = task.await.map_err(|e| {
                    NodeError::Api(ApiError::internal(format!("the step's task failed: {e}")))
                })??;
                Ok(Logged {
                    answer,
                    replayed: false,
                })
            }
        }
    }

    async fn run_logged<F, Fut>(
        &self,
        sb: Arc<Sandbox>,
        guard: Option<StepGuard>,
        call: TrajectoryCall,
        run: F,
    ) -> Result<Answer, NodeError>
    where
        F: FnOnce(Arc<dyn Instance>, SandboxInfo) -> Fut,
        Fut: Future<Output = Result<Done, NodeError>>,
    {
        // Failing here (deleted, lost) runs nothing, logs nothing, and frees the step.
        let limit = match &call {
            TrajectoryCall::Exec(c) | TrajectoryCall::Spawn(c) => c.timeout_secs,
            _ => None,
        };
        let limit = limit.map(std::time::Duration::from_secs_f64);
        let (instance, info, _busy) = self.ready_within(&sb, limit).await?;
        let started_ms = now_ms();
        let cancel = CancelLog {
            armed: guard
                .is_none()
                .then(|| (self.clone(), sb.clone(), call.clone(), started_ms)),
        };
        let outcome = run(instance, info).await;
        cancel.disarm();
        self.log_outcome(&sb, guard, call, started_ms, outcome)
            .await
    }

    /// Logs a finished call (durably), then hands its answer to the step's waiters.
    pub(crate) async fn log_outcome(
        &self,
        sb: &Arc<Sandbox>,
        guard: Option<StepGuard>,
        call: TrajectoryCall,
        started_ms: u64,
        outcome: Result<Done, NodeError>,
    ) -> Result<Answer, NodeError> {
        let step = guard.as_ref().map(StepGuard::step);
        let digest = request_digest(&call);
        let encoding = match &call {
            TrajectoryCall::Exec(e) | TrajectoryCall::Spawn(e) => e.encoding,
            _ => OutputEncoding::Utf8,
        };
        let mut entry = StoredEntry::new(call, step, started_ms);
        let mut blobs = Vec::new();
        let answer = match outcome {
            Ok(Done::Exec(out)) => {
                let x = &out.exit;
                entry.result = Some(StoredResult::Exec(StoredExec {
                    exit_code: x.exit_code,
                    signal: x.signal,
                    timed_out: x.timed_out,
                    stdout: StoredOutput::new(&out.stdout, &mut blobs),
                    stderr: StoredOutput::new(&out.stderr, &mut blobs),
                    stdout_truncated: x.stdout_truncated,
                    stderr_truncated: x.stderr_truncated,
                    stdout_bytes: x.stdout_bytes,
                    stderr_bytes: x.stderr_bytes,
                    duration_ms: x.duration_us as f64 / 1000.0,
                }));
                Ok(Answer::Exec(exec_result(
                    &out.stdout,
                    &out.stderr,
                    x,
                    encoding,
                )))
            }
            Ok(Done::Process(p)) => {
                entry.result = Some(StoredResult::Process(p.clone()));
                Ok(Answer::Process(p))
            }
            Ok(Done::Unit) => Ok(Answer::Done),
            Err(e) => {
                entry.error = Some(e.to_api());
                Err(e)
            }
        };
        let t = std::time::Instant::now();
        sb.log
            .append(self.journal(), entry, Some(digest), blobs)
            .await?;
        self.inner.metrics.observe_append(t.elapsed());
        Metrics::inc(&self.inner.metrics.trajectory_appends);
        if let Some(g) = guard {
            g.finish(
                digest,
                answer.as_ref().map(Clone::clone).map_err(NodeError::to_api),
            );
        }
        answer
    }

    /// Logs a call its caller abandoned (it was stopped).
    pub(crate) async fn log_cancelled(&self, sb: &Sandbox, call: TrajectoryCall, started_ms: u64) {
        let mut entry = StoredEntry::new(call, None, started_ms);
        entry.cancelled = true;
        match sb.log.append(self.journal(), entry, None, Vec::new()).await {
            Ok(_) => Metrics::inc(&self.inner.metrics.trajectory_appends),
            Err(e) => warn!(sandbox = %sb.id, error = %e, "cannot log a cancelled call"),
        }
    }
}
