//! The function substrate end to end: one-shot calls through warm pools of a real `warrend`
//! (isolation between consecutive calls, timeouts and caps, crash refill, admission when
//! saturated, many concurrent callers, the CLI, `substrate = "function"` sandboxes). Each
//! test starts its own daemon; see `common` for the skip rule.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod isolation;
mod limits;
mod pool;
mod zygote;

use warren_client::{CallRequest, CallResult};

use common::Daemon;

/// A shell call in the default image.
pub fn sh(cmd: &str) -> CallRequest {
    CallRequest {
        shell: Some(cmd.to_string()),
        ..Default::default()
    }
}

/// Runs a call, panicking with the daemon's log when the API refuses it.
pub async fn call(d: &Daemon, r: &CallRequest) -> CallResult {
    match d.client().call(r).await {
        Ok(r) => r,
        Err(e) => panic!("call {r:?} failed: {e}; log:\n{}", d.log_tail(20)),
    }
}

/// Runs a shell call that must exit 0; returns its stdout.
pub async fn sh_ok(d: &Daemon, cmd: &str) -> String {
    let r = call(d, &sh(cmd)).await;
    assert_eq!(
        r.exit_code,
        Some(0),
        "`{cmd}` failed: stdout {:?} stderr {:?}",
        r.stdout,
        r.stderr
    );
    r.stdout
}
