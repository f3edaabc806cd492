//! A call from the API: its pool key, the agent call, and the result.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;
use warren_proto::{ExecSpec, InvokeFile, InvokeSpec};
use warren_runtime::RuntimeError;
use warren_types::sandbox::LimitBounds;
use warren_types::{
    ApiError, CallFileResult, CallRequest, CallResult, CreateSandboxRequest, ErrorCode, Limits,
};

use super::{FunctionPools, PoolKey};

/// A call that waited this long (µs) inside its container for a call environment makes the
/// pool grow (see `Pool::cells_lagging`).
const CELL_LAG_US: u64 = 1_000;

/// Validates `req` and splits it into its pool key, the agent call and its input (the
/// files' contents then stdin).
pub fn prepare(
    req: &CallRequest,
    defaults: &Limits,
    bounds: &LimitBounds,
) -> Result<(PoolKey, InvokeSpec, Bytes), ApiError> {
    req.validate()?;
    let limits = CreateSandboxRequest {
        image: req.image.clone(),
        cpus: req.cpus,
        memory_mb: req.memory_mb,
        disk_mb: req.disk_mb,
        pids: req.pids,
        ..Default::default()
    }
    .validate(defaults, bounds)?;
    let key = PoolKey {
        image: req.image.refs(),
        limits,
        interpreter: req.interpreter.clone(),
        preload: req.preload.clone(),
        tenant: None,
    };
    let mut input = Vec::new();
    let mut files = Vec::with_capacity(req.files.len());
    for f in &req.files {
        let b = f.bytes()?;
        files.push(InvokeFile {
            path: warren_types::validate::sandbox_path(&f.path)?,
            size: b.len() as u64,
            mode: Some(f.mode.unwrap_or(0o644)),
        });
        input.extend_from_slice(&b);
    }
    if let Some(s) = &req.stdin {
        input.extend_from_slice(s.as_bytes());
    }
    let spec = InvokeSpec {
        exec: ExecSpec {
            argv: req.command(),
            cwd: req.cwd.clone(),
            env: req
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            user: req.user.clone(),
            timeout_ms: req.timeout_secs.map(|t| (t * 1000.0).ceil() as u64),
            output_cap: req.output_cap(),
            stdin: req.stdin.is_some(),
            window: None,
            // A call's environment ends with it: everything it started dies anyway.
            kill_tree: true,
            hold: None,
        },
        files,
        collect: req
            .return_files
            .iter()
            .map(|p| warren_types::validate::sandbox_path(p))
            .collect::<Result<_, _>>()?,
        collect_cap: req.file_cap(),
    };
    Ok((key, spec, Bytes::from(input)))
}

impl FunctionPools {
    /// `POST /v1/functions/call`: runs `req` in a warm container of its pool.
    pub async fn call(
        self: &Arc<Self>,
        req: CallRequest,
        defaults: &Limits,
        bounds: &LimitBounds,
    ) -> Result<CallResult, ApiError> {
        self.call_for(None, req, defaults, bounds).await
    }

    /// A call on behalf of `tenant`, in a pool that serves only that tenant.
    pub async fn call_for(
        self: &Arc<Self>,
        tenant: Option<String>,
        req: CallRequest,
        defaults: &Limits,
        bounds: &LimitBounds,
    ) -> Result<CallResult, ApiError> {
        let t0 = Instant::now();
        let (mut key, spec, input) = prepare(&req, defaults, bounds)?;
        key.tenant = tenant;
        // A container that died between two calls is replaced and the call tried once more
        // (calls are stateless: nothing of the failed attempt is left).
        let mut attempts = 0;
        loop {
            attempts += 1;
            let (pool, lease) = self.acquire(key.clone()).await?;
            let queued = lease.queued;
            let r = lease.member.warm.call(spec.clone(), input.clone()).await;
            match r {
                Ok(out) => {
                    pool.release(lease, true);
                    self.call_seconds.observe(t0.elapsed().as_secs_f64());
                    self.wait_seconds.observe(queued.as_secs_f64());
                    tracing::debug!(
                        cell_wait_us = out.cell_wait_us,
                        queued_us = queued.as_micros() as u64,
                        total_us = t0.elapsed().as_micros() as u64,
                        "function call"
                    );
                    if out.cell_wait_us >= CELL_LAG_US {
                        pool.cells_lagging();
                    }
                    let enc = req.encoding;
                    return Ok(CallResult {
                        exit_code: out.exit.exit_code,
                        signal: out.exit.signal,
                        timed_out: out.exit.timed_out,
                        stdout: enc.encode(&out.stdout),
                        stderr: enc.encode(&out.stderr),
                        stdout_truncated: out.exit.stdout_truncated,
                        stderr_truncated: out.exit.stderr_truncated,
                        stdout_bytes: out.exit.stdout_bytes,
                        stderr_bytes: out.exit.stderr_bytes,
                        encoding: enc,
                        files: out
                            .files
                            .into_iter()
                            .map(|f| CallFileResult {
                                content: enc.encode(&f.data),
                                path: f.path,
                                encoding: enc,
                                size: f.size,
                                truncated: f.truncated,
                                error: f.error,
                            })
                            .collect(),
                        duration_ms: t0.elapsed().as_secs_f64() * 1000.0,
                        queued_ms: queued.as_secs_f64() * 1000.0,
                    });
                }
                Err(RuntimeError::Agent { code, message })
                    if code == ErrorCode::InvalidRequest || code == ErrorCode::FileError =>
                {
                    // The call was refused (bad cwd, unwritable file); the container is fine.
                    pool.release(lease, true);
                    return Err(ApiError::new(code, message));
                }
                Err(e) => {
                    pool.release(lease, false);
                    let lost = matches!(e, RuntimeError::AgentLost) || lease_lost(&e);
                    if lost && attempts < 2 {
                        continue;
                    }
                    return Err(ApiError::new(
                        if lost {
                            ErrorCode::SandboxLost
                        } else {
                            e.code()
                        },
                        format!("function call failed: {e}"),
                    ));
                }
            }
        }
    }
}

fn lease_lost(e: &RuntimeError) -> bool {
    matches!(e, RuntimeError::Agent { code: ErrorCode::Internal, message } if message.contains("call environment"))
}
