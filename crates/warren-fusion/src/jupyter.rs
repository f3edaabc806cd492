//! `POST /run_jupyter`: cells of python run one after the other in one namespace, as a
//! notebook's `python3` kernel runs them, in one function call ([`JupyterPlan::new`]) whose
//! result becomes the protocol's answer ([`JupyterPlan::answer`]).
//!
//! The call runs a small Python driver (`jupyter.py`) on the pool's warm interpreter: each
//! cell's stdout and stderr are its own (file descriptors 1 and 2, so subprocesses count), the
//! value of a last expression is its display, an exception is its error and the next cells
//! still run; a cell over `cell_timeout` ends the run, and `total_timeout` is the call's. The
//! driver rewrites its record after every cell, so a run cut short still answers the cells
//! that ended. No kernel process outlives the call: the next request starts from nothing.

use base64::Engine;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use warren_types::function::MAX_RETURN_CAP;
use warren_types::{CallFile, CallRequest, CallResult, ImageRef, OutputEncoding};

use crate::error::FusionError;
use crate::wire::{CommandRunResult, CommandRunStatus, RunStatus, MAX_TIMEOUT};

const STATE: &str = "/tmp/.warren-fusion";
const DRIVER: &str = include_str!("jupyter.py");
/// Seconds the call may take beyond the total timeout (the driver's start and record).
const SLACK_SECS: f64 = 5.0;

fn forty_five() -> f64 {
    45.0
}

fn python3() -> String {
    "python3".into()
}

/// `POST /run_jupyter`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJupyterRequest {
    /// The cells' sources, run in order.
    pub cells: Vec<String>,
    /// Seconds one cell may run; zero: only the total timeout applies.
    #[serde(default)]
    pub cell_timeout: f64,
    /// Seconds all the cells may take.
    #[serde(default = "forty_five")]
    pub total_timeout: f64,
    /// The kernel: `python3`, the only one the protocol names.
    #[serde(default = "python3")]
    pub kernel: String,
    /// Files written before the first cell: path (relative to the working directory, or
    /// absolute) → base64 contents; `null` contents are skipped.
    #[serde(default)]
    pub files: BTreeMap<String, Option<String>>,
    /// Files read back after the last cell, by the same names; missing ones are left out.
    #[serde(default)]
    pub fetch_files: Vec<String>,
    /// Warren's extension: the image (or image stack) to run in; the default image when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRef>,
}

/// What one cell did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellRunResult {
    pub stdout: String,
    pub stderr: String,
    /// The value of its last expression, as MIME type → text (`text/plain`, `text/html`).
    pub display: Vec<serde_json::Value>,
    /// The exception it raised: `ename`, `evalue`, `traceback` (lines).
    pub error: Vec<serde_json::Value>,
}

/// The answer of `POST /run_jupyter`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunJupyterResponse {
    /// `Success` when every cell ran (whatever they raised), `Failed` when the run was cut
    /// short by a timeout or the interpreter died, `SandboxError` when it could not run.
    pub status: RunStatus,
    pub message: String,
    /// The run as a whole (the interpreter that ran the cells).
    pub driver: Option<CommandRunResult>,
    pub cells: Vec<CellRunResult>,
    pub executor_pod_name: Option<String>,
    pub files: BTreeMap<String, String>,
}

impl RunJupyterResponse {
    /// The server-side failure answer.
    pub fn sandbox_error(message: impl Into<String>) -> Self {
        RunJupyterResponse {
            status: RunStatus::SandboxError,
            message: message.into(),
            driver: None,
            cells: Vec::new(),
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }
}

/// Parses a `/run_jupyter` body; the errors are the protocol's validation errors.
pub fn parse_jupyter(body: &[u8]) -> Result<RunJupyterRequest, FusionError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(FusionError::invalid(&["body"], "Field required", "missing"));
    }
    let req: RunJupyterRequest = serde_json::from_slice(body)
        .map_err(|e| FusionError::invalid(&["body"], e.to_string(), "json_invalid"))?;
    req.validate()?;
    Ok(req)
}

impl RunJupyterRequest {
    /// Checks what the types leave open.
    pub fn validate(&self) -> Result<(), FusionError> {
        if self.kernel != "python3" {
            return Err(FusionError::invalid(
                &["body", "kernel"],
                "Input should be 'python3'",
                "literal_error",
            ));
        }
        if !(self.cell_timeout.is_finite()
            && self.cell_timeout >= 0.0
            && self.cell_timeout <= MAX_TIMEOUT)
        {
            return Err(FusionError::invalid(
                &["body", "cell_timeout"],
                format!("Input should be at least 0 and at most {MAX_TIMEOUT}"),
                "value_error",
            ));
        }
        if !(self.total_timeout.is_finite()
            && self.total_timeout > 0.0
            && self.total_timeout <= MAX_TIMEOUT)
        {
            return Err(FusionError::invalid(
                &["body", "total_timeout"],
                format!("Input should be greater than 0 and at most {MAX_TIMEOUT}"),
                "value_error",
            ));
        }
        Ok(())
    }
}

/// How one `/run_jupyter` request runs and how its answer is read.
#[derive(Debug, Clone)]
pub struct JupyterPlan {
    fetch: Vec<String>,
    cell_timeout: f64,
}

#[derive(Deserialize)]
struct Record {
    cells: Vec<CellRunResult>,
    timed_out: bool,
}

fn text(b64: &str) -> String {
    match base64::engine::general_purpose::STANDARD.decode(b64) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => b64.to_string(),
    }
}

impl JupyterPlan {
    /// The call that runs `req`, and the plan to read its answer.
    pub fn new(req: &RunJupyterRequest) -> Result<(JupyterPlan, CallRequest), FusionError> {
        req.validate()?;
        let spec = serde_json::json!({"cells": req.cells, "cell_timeout": req.cell_timeout});
        let mut call = CallRequest {
            image: req.image.clone().unwrap_or_default(),
            argv: Some(vec!["python3".into(), format!("{STATE}/jupyter.py")]),
            interpreter: Some("python3".into()),
            // The driver's own directory, which the call's files make; the driver makes the
            // working directory (a request may bring no file into it) and moves there.
            cwd: Some(STATE.into()),
            encoding: OutputEncoding::Base64,
            max_file_bytes: Some(MAX_RETURN_CAP),
            timeout_secs: Some(req.total_timeout + SLACK_SECS),
            ..Default::default()
        };
        call.env.insert("HOME".into(), "/tmp".into());
        call.files.push(CallFile {
            path: format!("{STATE}/jupyter.py"),
            content: DRIVER.into(),
            ..Default::default()
        });
        call.files.push(CallFile {
            path: format!("{STATE}/cells.json"),
            content: spec.to_string(),
            ..Default::default()
        });
        for (name, content) in &req.files {
            let Some(content) = content else { continue };
            call.files.push(CallFile {
                path: crate::plan::in_workdir(name),
                content: content.clone(),
                encoding: OutputEncoding::Base64,
                mode: None,
            });
        }
        call.return_files.push(format!("{STATE}/cells.out.json"));
        for name in &req.fetch_files {
            call.return_files.push(crate::plan::in_workdir(name));
        }
        call.validate().map_err(FusionError::from_api)?;
        Ok((
            JupyterPlan {
                fetch: req.fetch_files.clone(),
                cell_timeout: req.cell_timeout,
            },
            call,
        ))
    }

    /// The answer to the request, from the call's result; `node` names who ran it.
    pub fn answer(&self, r: &CallResult, node: Option<&str>) -> RunJupyterResponse {
        let mut resp = self.cells(r);
        resp.executor_pod_name = node.map(str::to_string);
        if resp.status == RunStatus::SandboxError {
            return resp;
        }
        for (name, f) in self.fetch.iter().zip(r.files.iter().skip(1)) {
            if f.error.is_none() && !f.truncated {
                resp.files.insert(name.clone(), f.content.clone());
            }
        }
        resp
    }

    fn cells(&self, r: &CallResult) -> RunJupyterResponse {
        let record = r.files.first().filter(|f| f.error.is_none());
        if record.is_some_and(|f| f.truncated) {
            return RunJupyterResponse::sandbox_error(format!(
                "the cells' outputs are larger than the {MAX_RETURN_CAP} bytes an answer holds"
            ));
        }
        let record = match record.map(|f| serde_json::from_str::<Record>(&text(&f.content))) {
            Some(Ok(rec)) => Some(rec),
            Some(Err(e)) => {
                return RunJupyterResponse::sandbox_error(format!(
                    "the cells' record is unreadable: {e}"
                ))
            }
            None => None,
        };
        let time = Some(((r.duration_ms - r.queued_ms).max(0.0)) / 1000.0);
        let cell_tle = record.as_ref().is_some_and(|rec| rec.timed_out);
        let (status, return_code) = if r.timed_out || cell_tle {
            (CommandRunStatus::TimeLimitExceeded, None)
        } else if let Some(c) = r.exit_code {
            (CommandRunStatus::Finished, Some(c))
        } else if let Some(s) = r.signal {
            (CommandRunStatus::Finished, Some(128 + s))
        } else {
            return RunJupyterResponse::sandbox_error(format!(
                "the cells' interpreter neither exited nor was killed: {}",
                text(&r.stderr)
            ));
        };
        let ok = status == CommandRunStatus::Finished && return_code == Some(0) && record.is_some();
        let mut message = String::new();
        if cell_tle {
            message = format!("a cell ran longer than its {} s", self.cell_timeout);
        } else if r.timed_out {
            message = "the cells ran longer than total_timeout".into();
        } else if !ok {
            message = format!(
                "the cells' interpreter ended early (exit status {return_code:?}): {}",
                text(&r.stderr)
            );
        }
        RunJupyterResponse {
            status: if ok {
                RunStatus::Success
            } else {
                RunStatus::Failed
            },
            message,
            driver: Some(CommandRunResult {
                status,
                execution_time: time,
                return_code,
                stdout: Some(text(&r.stdout)),
                stderr: Some(text(&r.stderr)),
            }),
            cells: record.map(|r| r.cells).unwrap_or_default(),
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
#[path = "jupyter_tests.rs"]
mod tests;
