//! A request as a function call ([`Plan::new`]) and the call's result as the answer
//! ([`Plan::answer`]).

use base64::Engine;
use std::collections::BTreeMap;
use warren_types::function::MAX_RETURN_CAP;
use warren_types::{CallFile, CallRequest, CallResult, OutputEncoding};

use crate::error::FusionError;
use crate::lang::{self, Toolchain};
use crate::wire::{CommandRunResult, CommandRunStatus, RunCodeRequest, RunCodeResponse, RunStatus};

/// The working directory of every program: its source and relative files go there.
pub const WORKDIR: &str = "/tmp/code";
/// Where the driver and its step records live inside the call.
const STATE: &str = "/tmp/.warren-fusion";
const DRIVER: &str = include_str!("driver.sh");
/// The driver's records, read back in this order before the fetched files.
const RECORDS: [&str; 5] = [
    "missing",
    "compile.rc",
    "compile.out",
    "compile.err",
    "run.rc",
];
/// What a compiled program is called.
const BIN: &str = "main";
/// Seconds the whole call may take beyond its steps' timeouts (driver, file writes).
const SLACK_SECS: f64 = 10.0;
/// The largest writable layer a call gets by default (MiB), kept under its memory limit.
const DEFAULT_DISK_MB: u64 = 512;

/// How one request runs and how its answer is read.
#[derive(Debug, Clone)]
pub struct Plan {
    language: &'static str,
    driver: bool,
    /// Whether the driver compiles first.
    compiles: bool,
    /// Names as asked, in the order of the call's `return_files` (after the driver's).
    fetch: Vec<String>,
    compile_timeout: f64,
    run_timeout: f64,
}

pub(crate) fn in_workdir(name: &str) -> String {
    if name.starts_with('/') {
        name.to_string()
    } else {
        format!("{WORKDIR}/{name}")
    }
}

/// `s` as one word of a POSIX shell command.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn lossy(b64: &str) -> String {
    match base64::engine::general_purpose::STANDARD.decode(b64) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => b64.to_string(),
    }
}

/// A step record of the driver: exit status and seconds taken.
fn record(text: &str) -> Option<(i32, Option<f64>)> {
    let mut it = text.split_whitespace();
    let rc = it.next()?.parse().ok()?;
    let t = match (
        it.next().map(str::parse::<u128>),
        it.next().map(str::parse::<u128>),
    ) {
        (Some(Ok(s)), Some(Ok(e))) if e >= s => Some((e - s) as f64 / 1e9),
        _ => None,
    };
    Some((rc, t))
}

impl Plan {
    /// The call that runs `req`, and the plan to read its answer.
    pub fn new(req: &RunCodeRequest) -> Result<(Plan, CallRequest), FusionError> {
        req.validate()?;
        let Some(lang) = lang::served(&req.language) else {
            let served: Vec<&str> = lang::LANGUAGES.iter().map(|l| l.name).collect();
            return Err(FusionError::Sandbox(format!(
                "language {} is not served here; served: {}",
                req.language,
                served.join(", ")
            )));
        };
        let class = (lang.name == "java").then(|| lang::java_class(&req.code));
        let source = match &class {
            Some(c) => format!("{c}.java"),
            None => lang.source.to_string(),
        };
        let mut call = CallRequest {
            image: req.image.clone().unwrap_or_default(),
            stdin: req.stdin.clone(),
            cwd: Some(WORKDIR.into()),
            encoding: OutputEncoding::Base64,
            max_file_bytes: Some(MAX_RETURN_CAP),
            memory_mb: req.memory_mb(),
            disk_mb: req.memory_mb().map(|m| m.min(DEFAULT_DISK_MB)),
            ..Default::default()
        };
        call.files.push(CallFile {
            path: in_workdir(&source),
            content: req.code.clone(),
            ..Default::default()
        });
        for (name, content) in &req.files {
            let Some(content) = content else { continue };
            call.files.push(CallFile {
                path: in_workdir(name),
                content: content.clone(),
                encoding: OutputEncoding::Base64,
                mode: None,
            });
        }
        let driver = matches!(lang.toolchain, Toolchain::Driver { .. });
        match lang.toolchain {
            Toolchain::Python => {
                call.argv = Some(vec!["python3".into(), in_workdir(&source)]);
                call.interpreter = Some("python3".into());
                call.timeout_secs = Some(req.run_timeout);
            }
            Toolchain::Direct { interpreter } => {
                call.argv = Some(vec![interpreter.into(), source.clone()]);
                call.timeout_secs = Some(req.run_timeout);
            }
            Toolchain::Driver {
                needs,
                compile,
                run,
            } => {
                let fill = |t: &str| {
                    t.replace("{src}", &quote(&source))
                        .replace("{bin}", BIN)
                        .replace("{class}", class.as_deref().unwrap_or("Main"))
                };
                let mut run = fill(run);
                if lang.name == "pytest" {
                    for a in &req.args {
                        run.push(' ');
                        run.push_str(&quote(a));
                    }
                }
                call.files.push(CallFile {
                    path: format!("{STATE}/driver"),
                    content: DRIVER.into(),
                    ..Default::default()
                });
                call.argv = Some(vec![
                    "/bin/sh".into(),
                    format!("{STATE}/driver"),
                    req.compile_timeout.to_string(),
                    req.run_timeout.to_string(),
                    needs.join(" "),
                    compile.map(fill).unwrap_or_default(),
                    run,
                ]);
                let compile_time = if compile.is_some() {
                    req.compile_timeout
                } else {
                    0.0
                };
                call.timeout_secs = Some(compile_time + req.run_timeout + SLACK_SECS);
                call.env.insert("HOME".into(), "/tmp".into());
                call.env.insert("GOCACHE".into(), "/tmp/.cache/go".into());
                call.env.insert("GOPATH".into(), "/tmp/go".into());
                call.return_files = RECORDS.iter().map(|r| format!("{STATE}/{r}")).collect();
            }
        }
        for name in &req.fetch_files {
            call.return_files.push(in_workdir(name));
        }
        call.validate().map_err(FusionError::from_api)?;
        Ok((
            Plan {
                language: lang.name,
                driver,
                compiles: matches!(
                    lang.toolchain,
                    Toolchain::Driver {
                        compile: Some(_),
                        ..
                    }
                ),
                fetch: req.fetch_files.clone(),
                compile_timeout: req.compile_timeout,
                run_timeout: req.run_timeout,
            },
            call,
        ))
    }

    /// The answer to the request, from the call's result; `node` names who ran it.
    pub fn answer(&self, r: &CallResult, node: Option<&str>) -> RunCodeResponse {
        let mut resp = if self.driver {
            self.driven(r)
        } else {
            self.direct(r)
        };
        resp.executor_pod_name = node.map(str::to_string);
        if resp.status == RunStatus::SandboxError {
            return resp;
        }
        let skip = if self.driver { RECORDS.len() } else { 0 };
        let mut not_returned = Vec::new();
        for (name, f) in self.fetch.iter().zip(r.files.iter().skip(skip)) {
            if f.error.is_some() {
                continue; // missing files are left out, as the protocol does
            }
            if f.truncated {
                not_returned.push(format!("{name} ({} bytes)", f.size));
                continue;
            }
            resp.files.insert(name.clone(), f.content.clone());
        }
        if !not_returned.is_empty() {
            resp.message = format!(
                "fetch_files larger than {MAX_RETURN_CAP} bytes were not returned: {}",
                not_returned.join(", ")
            );
        }
        resp
    }

    fn status_of(results: &[&CommandRunResult]) -> RunStatus {
        let failed = results.iter().any(|r| {
            r.status == CommandRunStatus::TimeLimitExceeded || r.return_code.is_some_and(|c| c != 0)
        });
        if failed {
            RunStatus::Failed
        } else {
            RunStatus::Success
        }
    }

    fn direct(&self, r: &CallResult) -> RunCodeResponse {
        let time = Some(((r.duration_ms - r.queued_ms).max(0.0)) / 1000.0);
        let (status, return_code) = if r.timed_out {
            (CommandRunStatus::TimeLimitExceeded, None)
        } else if let Some(c) = r.exit_code {
            (CommandRunStatus::Finished, Some(c))
        } else if let Some(s) = r.signal {
            (CommandRunStatus::Finished, Some(128 + s))
        } else {
            return RunCodeResponse::sandbox_error(format!(
                "the {} program neither exited nor was killed: {}",
                self.language,
                lossy(&r.stderr)
            ));
        };
        let run = CommandRunResult {
            status,
            execution_time: time,
            return_code,
            stdout: Some(lossy(&r.stdout)),
            stderr: Some(lossy(&r.stderr)),
        };
        RunCodeResponse {
            status: Self::status_of(&[&run]),
            message: String::new(),
            compile_result: None,
            run_result: Some(run),
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }

    /// A driver step's result from its record; `None` when the step never ended (the whole
    /// call ran out of time while it ran).
    fn step(
        rec: Option<&str>,
        timeout: f64,
        stdout: String,
        stderr: String,
    ) -> Option<CommandRunResult> {
        let (rc, time) = record(rec?)?;
        // `timeout -s KILL` exits 137 when it killed the step; a step that ended by itself
        // with that status before its time is a program killed by a signal (e.g. memory).
        let timed_out = rc == 137 && time.is_some_and(|t| t >= timeout * 0.99);
        Some(CommandRunResult {
            status: if timed_out {
                CommandRunStatus::TimeLimitExceeded
            } else {
                CommandRunStatus::Finished
            },
            execution_time: time,
            return_code: (!timed_out).then_some(rc),
            stdout: Some(stdout),
            stderr: Some(stderr),
        })
    }

    fn driven(&self, r: &CallResult) -> RunCodeResponse {
        let rec = |i: usize| {
            r.files
                .get(i)
                .filter(|f| f.error.is_none())
                .map(|f| lossy(&f.content))
        };
        if let Some(tool) = rec(0) {
            return RunCodeResponse::sandbox_error(format!(
                "language {} needs `{tool}`, which this image does not have",
                self.language
            ));
        }
        let compile_rec = rec(1);
        let compile = Self::step(
            compile_rec.as_deref(),
            self.compile_timeout,
            rec(2).unwrap_or_default(),
            rec(3).unwrap_or_default(),
        );
        let run = Self::step(
            rec(4).as_deref(),
            self.run_timeout,
            lossy(&r.stdout),
            lossy(&r.stderr),
        );
        let tle = |out: String, err: String, t: f64| CommandRunResult {
            status: CommandRunStatus::TimeLimitExceeded,
            execution_time: Some(t),
            return_code: None,
            stdout: Some(out),
            stderr: Some(err),
        };
        let (compile, run) = match (compile, run) {
            (c, Some(run)) => (c, Some(run)),
            // Compiled and failed: no run, as the protocol answers a compile error.
            (Some(c), None) if c.return_code != Some(0) => (Some(c), None),
            // The call's own deadline cut a step short.
            (Some(c), None) if r.timed_out => (
                Some(c),
                Some(tle(lossy(&r.stdout), lossy(&r.stderr), self.run_timeout)),
            ),
            (None, None) if r.timed_out && self.compiles && compile_rec.is_none() => (
                Some(tle(
                    rec(2).unwrap_or_default(),
                    rec(3).unwrap_or_default(),
                    self.compile_timeout,
                )),
                None,
            ),
            (None, None) if r.timed_out && !self.compiles => (
                None,
                Some(tle(lossy(&r.stdout), lossy(&r.stderr), self.run_timeout)),
            ),
            _ => {
                return RunCodeResponse::sandbox_error(format!(
                    "the {} driver ended early (exit {:?}, signal {:?}): {}",
                    self.language,
                    r.exit_code,
                    r.signal,
                    lossy(&r.stderr)
                ))
            }
        };
        let steps: Vec<&CommandRunResult> = compile.iter().chain(run.iter()).collect();
        RunCodeResponse {
            status: Self::status_of(&steps),
            message: String::new(),
            compile_result: compile,
            run_result: run,
            executor_pod_name: None,
            files: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
