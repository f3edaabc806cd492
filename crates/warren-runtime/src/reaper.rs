//! The daemon's one reaper of child processes.
//!
//! The daemon is a child subreaper (orphaned sandbox processes come to it), so exactly one
//! thread calls `waitpid(-1)`. Code that needs a child's exit status spawns it through
//! [`spawn_wait`] (or `warren_sys::children::output` for a `std` command), which registers
//! the pid under the same lock the reaper takes before it looks a reaped pid up, so a child
//! that exits at once is never missed. Statuses of unregistered children (agents' first
//! stages, orphans) are dropped.

use std::os::fd::RawFd;
use std::time::Duration;
use tokio::sync::oneshot;
use warren_sys::process::HugePages;

pub use warren_sys::children::ChildExit;

use crate::RuntimeError;

/// Starts the reaper thread. Call once, before any child is spawned and before an async
/// runtime exists. Also makes the process a child subreaper.
pub fn start() -> Result<(), RuntimeError> {
    use nix::errno::Errno;
    use nix::sys::wait::{waitpid, WaitStatus};
    if !warren_sys::children::claim_reaping() {
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
                warren_sys::children::deliver(pid, exit);
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
    spawn_wait_with(program, argv, envp, fds, HugePages::Allowed)
}

/// [`spawn_wait`], saying whether the program may have transparent huge pages.
pub fn spawn_wait_with(
    program: &str,
    argv: &[String],
    envp: &[String],
    fds: &[(RawFd, RawFd)],
    huge_pages: HugePages,
) -> Result<(u32, oneshot::Receiver<ChildExit>), RuntimeError> {
    let (tx, rx) = oneshot::channel();
    let mut reg = warren_sys::children::registry();
    let pid = warren_sys::process::spawn_with_fds(program, argv, envp, fds, huge_pages)?;
    reg.insert(
        pid,
        Box::new(move |exit| {
            let _ = tx.send(exit);
        }),
    );
    Ok((pid, rx))
}
