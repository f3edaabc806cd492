//! After a daemon restart: the results of steps whose commands were running when the old
//! daemon died, collected from the agents that held them into the trajectory log.
//!
//! Each held command's step is claimed before the node serves, so a retry of the step waits
//! for the collection and answers the logged result (`replayed`) instead of running the
//! command again. A run that cannot be recovered whole (its streamed stdin was cut off, or
//! its agent cannot hand the result back) is logged as `step_interrupted`, with what is
//! known, and the step is never run again either.

use std::time::Duration;
use tracing::{info, warn};
use warren_runtime::ExecOutput;
use warren_types::{ApiError, ErrorCode, SandboxId};

use super::runner::{Begun, HoldNote};
use super::Manager;
use crate::error::NodeError;
use crate::trajectory::{request_digest, Exec};

/// How long an adopted agent may take to list what it holds.
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Claims the held steps of the adopted sandboxes `ids` and collects each on a task of its
/// own. A paused sandbox's frozen agent is not asked (a step that a pause froze mid-run is
/// not collected: its retry runs it after the resume).
pub(super) async fn collect_all(m: &Manager, ids: &[SandboxId]) {
    for id in ids {
        collect(m, id).await;
    }
}

async fn collect(m: &Manager, id: &SandboxId) {
    let Ok(sb) = m.lookup(id) else { return };
    let Some(instance) = sb.lock().instance.clone() else {
        return;
    };
    if instance.is_paused() {
        // A frozen agent answers nothing; a paused sandbox ran nothing since its pause.
        return;
    }
    let agent = instance.agent().clone();
    let steps = match tokio::time::timeout(LIST_TIMEOUT, agent.held()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            warn!(sandbox = %id, error = %e, "cannot list the held steps of an adopted sandbox");
            return;
        }
        Err(_) => {
            warn!(sandbox = %id, "the adopted sandbox's agent did not list its held steps in time");
            return;
        }
    };
    for held in steps {
        let step = held.step;
        let note: HoldNote = match serde_json::from_str(&held.note) {
            Ok(n) => n,
            Err(e) => {
                warn!(sandbox = %id, step, error = %e, "a held step's note cannot be read; released");
                let _ = agent.release(step).await;
                continue;
            }
        };
        let digest = request_digest(&note.call);
        match m.begin::<Exec>(id, Some(step), Some(digest)).await {
            Ok(Begun::Run(mut run)) => {
                run.started_at(note.started_ms);
                info!(sandbox = %id, step, done = held.done, "collecting a step that ran across the daemon's restart");
                let agent = agent.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    let outcome = interrupted_or(agent.collect(step).await, step);
                    if let Err(e) = run.finish(note.call, outcome).await {
                        if e.code() != ErrorCode::StepInterrupted {
                            warn!(sandbox = %id, step, error = %e, "cannot log a collected step");
                        }
                    }
                });
            }
            Ok(Begun::Replay(_)) => {
                // Logged before the old daemon died: only the release was lost.
                let _ = agent.release(step).await;
            }
            Err(e) => {
                warn!(sandbox = %id, step, error = %e, "a held step cannot be claimed; released");
                let _ = agent.release(step).await;
            }
        }
    }
}

/// The outcome a collected step is logged with.
fn interrupted_or(
    collected: Result<(ExecOutput, bool), warren_runtime::RuntimeError>,
    step: u64,
) -> Result<ExecOutput, NodeError> {
    match collected {
        Ok((out, false)) => Ok(out),
        Ok((out, true)) => Err(interrupted(format!(
            "step {step}'s command was running when the node's daemon went away and its stdin \
             was cut off then; it ended with {} after {} ms ({} bytes of stdout, {} of stderr); \
             it is not run again",
            ended(&out.exit),
            out.exit.duration_us / 1000,
            out.exit.stdout_bytes,
            out.exit.stderr_bytes
        ))),
        Err(e) => Err(interrupted(format!(
            "step {step}'s command was running when the node's daemon went away, and its \
             result could not be collected from the sandbox ({e}); it is not run again"
        ))),
    }
}

fn ended(exit: &warren_types::ExitInfo) -> String {
    match (exit.exit_code, exit.signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "an unknown end".to_string(),
    }
}

fn interrupted(message: String) -> NodeError {
    NodeError::Api(ApiError::new(ErrorCode::StepInterrupted, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disturbed_or_lost_run_is_interrupted_and_says_what_is_known() {
        let mut out = ExecOutput::default();
        out.exit.exit_code = Some(0);
        assert!(interrupted_or(Ok((out.clone(), false)), 3).is_ok());
        out.exit.stdout_bytes = 12;
        let e = interrupted_or(Ok((out, true)), 3).unwrap_err();
        assert_eq!(e.code(), ErrorCode::StepInterrupted);
        assert!(e.to_string().contains("exit code 0"), "{e}");
        assert!(e.to_string().contains("12 bytes of stdout"), "{e}");
        let e = interrupted_or(Err(warren_runtime::RuntimeError::AgentLost), 5).unwrap_err();
        assert_eq!(e.code(), ErrorCode::StepInterrupted);
        assert!(e.to_string().contains("step 5"), "{e}");
    }
}
