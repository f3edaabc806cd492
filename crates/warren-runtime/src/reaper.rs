//! The daemon's one reaper of child processes.
//!
//! The daemon is a child subreaper (orphaned sandbox processes come to it), so exactly one
//! thread calls `waitpid(-1)`. Code that needs a child's exit status spawns it through
//! [`spawn_wait`], which registers the pid under the same lock the reaper takes before it
//! looks a reaped pid up, so a child that exits at once is never missed. Statuses of
//! unregistered children (agents' first stages, orphans) are dropped.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::RuntimeError;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

impl ChildExit {
    pub fn success(self) -> bool {
        self == ChildExit::Code(0)
    }
}

fn waiters() -> &'static Mutex<HashMap<i32, oneshot::Sender<ChildExit>>> {
    static W: OnceLock<Mutex<HashMap<i32, oneshot::Sender<ChildExit>>>> = OnceLock::new();
    W.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Starts the reaper thread. Call once, before any child is spawned and before an async
/// runtime exists. Also makes the process a child subreaper.
pub fn start() -> Result<(), RuntimeError> {
    use nix::errno::Errno;
    use nix::sys::wait::{waitpid, WaitStatus};
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if STARTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
        return Ok(());
    }
    warren_sys::process::set_child_subreaper()?;
    std::thread::Builder::new()
        .name("reaper".into())
        .spawn(|| loop {
            let exit = match waitpid(None, None) {
                Ok(WaitStatus::Exited(pid, code)) => Some((pid.as_raw(), ChildExit::Code(code))),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    Some((pid.as_raw(), ChildExit::Signal(sig as i32)))
                }
                Ok(_) | Err(Errno::EINTR) => None,
                Err(Errno::ECHILD) => {
                    std::thread::sleep(Duration::from_millis(50));
                    None
                }
                Err(e) => {
                    tracing::error!(error = %e, "waitpid failed");
                    std::thread::sleep(Duration::from_millis(50));
                    None
                }
            };
            if let Some((pid, exit)) = exit {
                let tx = waiters()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&pid);
                if let Some(tx) = tx {
                    let _ = tx.send(exit);
                }
            }
        })
        .map_err(|e| RuntimeError::io("start the reaper thread", e))?;
    Ok(())
}

/// Spawns `program` (see [`warren_sys::process::spawn_with_fds`]) and returns a receiver of
/// its exit status. Only works in a process whose reaper was started with [`start`].
pub fn spawn_wait(
    program: &str,
    argv: &[String],
    envp: &[String],
    fds: &[(RawFd, RawFd)],
) -> Result<(u32, oneshot::Receiver<ChildExit>), RuntimeError> {
    let (tx, rx) = oneshot::channel();
    let mut w = waiters().lock().unwrap_or_else(|p| p.into_inner());
    let pid = warren_sys::process::spawn_with_fds(program, argv, envp, fds)?;
    w.insert(pid as i32, tx);
    Ok((pid, rx))
}
