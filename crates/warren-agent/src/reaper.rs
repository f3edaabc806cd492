//! PID 1 duty: reap every child (ours or orphans) and hand exit statuses to their waiters.

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use tokio::sync::oneshot;

use crate::run::Exit;

#[derive(Default)]
pub struct Reaper {
    waiters: RefCell<HashMap<i32, oneshot::Sender<Exit>>>,
}

impl Reaper {
    /// Starts the reaping task. Must run before any child is spawned.
    pub fn start() -> Rc<Reaper> {
        let r = Rc::new(Reaper::default());
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
            .expect("SIGCHLD handler");
        let weak = Rc::downgrade(&r);
        tokio::task::spawn_local(async move {
            loop {
                let Some(r) = weak.upgrade() else { return };
                r.reap();
                drop(r);
                if sig.recv().await.is_none() {
                    return;
                }
            }
        });
        r
    }

    /// Registers interest in `pid`. Call right after spawning, before yielding to the runtime.
    pub fn watch(&self, pid: u32) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().insert(pid as i32, tx);
        rx
    }

    fn reap(&self) {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.deliver(pid.as_raw(), Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => {
                    self.deliver(pid.as_raw(), Exit::Signal(sig as i32))
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    fn deliver(&self, pid: i32, exit: Exit) {
        if let Some(tx) = self.waiters.borrow_mut().remove(&pid) {
            let _ = tx.send(exit);
        }
    }
}

/// Fields of /proc/PID/stat after the command name: (ppid, pgrp, session, starttime), for
/// processes that are not dead already (zombies wait for the reaper).
fn stat_fields(pid: u32) -> Option<(u32, u32, u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    if matches!(f.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    Some((
        f.get(1)?.parse().ok()?,
        f.get(2)?.parse().ok()?,
        f.get(3)?.parse().ok()?,
        f.get(19)?.parse().ok()?,
    ))
}

/// Start time of a process in clock ticks since boot.
pub fn start_ticks(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|f| f.3)
}

/// Kills a command's whole tree: its process group, every process still in its session, and
/// (when `since` is given) every orphan started after the command began that left its session
/// (`setsid`, double fork) — unless it belongs to another live command in `protect`.
/// Returns how many live processes it signalled.
pub fn kill_command(leader: u32, since: Option<u64>, protect: &[u32]) -> usize {
    let _ = warren_sys::process::kill_group(leader, libc::SIGKILL);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut killed = 0;
    for ent in dir.flatten() {
        let Some(pid) = ent.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == 1 {
            continue;
        }
        let Some((ppid, pgrp, session, started)) = stat_fields(pid) else {
            continue;
        };
        let ours = pgrp == leader || session == leader;
        let stray = since.is_some_and(|s| {
            ppid == 1
                && started >= s
                && !protect.contains(&pgrp)
                && !protect.contains(&session)
                && !protect.contains(&pid)
        });
        if ours || stray {
            let _ = warren_sys::process::kill(pid, libc::SIGKILL);
            killed += 1;
        }
    }
    killed
}

/// [`kill_command`] until nothing of the command is left alive: a process that forked while
/// a pass ran is found by the next one (a fork bomb under its pid limit ends in a few).
pub async fn kill_command_fully(leader: u32, since: Option<u64>, protect: &[u32]) {
    for _ in 0..200 {
        if kill_command(leader, since, protect) == 0 {
            return;
        }
        // Lets the reaper collect the dead before the next pass looks again.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// Kills a command's process group and session.
pub fn kill_tree(leader: u32) {
    kill_command(leader, None, &[]);
}
