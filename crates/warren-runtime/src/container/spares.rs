//! Agents started ahead of need.
//!
//! Before an agent can read its start-up message it costs a `posix_spawn`, an `execve` and the
//! loader's start-up (on a VM mostly glibc's CPU probe, every `cpuid` a VM exit: see
//! `docs/performance.md`), about a millisecond that a create would otherwise wait for. The
//! runtime keeps a few agents started and parked on that first read; a create takes one, moves
//! it into the sandbox's cgroups and only then sends the configuration, exactly as with an
//! agent started for it.
//!
//! A parked agent belongs to no sandbox: it has read nothing, holds nothing of one and runs in
//! the daemon's own groups. Its only tie is its control socket: when the runtime drops it (at
//! shutdown, or when the daemon dies), the agent reads end-of-file and exits. One that died
//! while parked (killed from outside) shows a hung-up socket and is passed over.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::ContainerConfig;
use crate::RuntimeError;

/// An agent started in `container` mode, waiting for its start-up message on `ctl`.
pub(crate) struct Spare {
    pub pid: u32,
    /// The daemon's end of the agent's control socket.
    pub ctl: OwnedFd,
}

impl Spare {
    fn start(cfg: &ContainerConfig) -> Result<Spare, RuntimeError> {
        let (ours, theirs) = warren_sys::fd::socketpair()?;
        let pid = super::spawn_agent(cfg, "container", &theirs)?;
        Ok(Spare { pid, ctl: ours })
    }

    /// Still parked: the agent writes nothing before its start-up message, so a readable or
    /// hung-up socket means it is gone.
    fn parked(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(self.ctl.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(0))
    }
}

/// The parked agents of one container runtime.
pub(crate) struct Spares {
    cfg: ContainerConfig,
    /// How many to keep parked (0: every create starts its own agent).
    want: usize,
    parked: Mutex<Vec<Spare>>,
    /// A refill is running.
    filling: AtomicBool,
    /// Shut down: nothing more is parked.
    closed: AtomicBool,
}

impl Spares {
    pub fn new(cfg: ContainerConfig, want: usize) -> Arc<Spares> {
        let s = Arc::new(Spares {
            cfg,
            want,
            parked: Mutex::new(Vec::new()),
            filling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        });
        s.refill();
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Spare>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A started agent: a parked one that is still alive, else one started now (`parked`
    /// says which). Either way the parked set is refilled in the background.
    ///
    /// A parked agent killed just before this look may still seem alive (the kill is not
    /// yet delivered): its start-up then fails on a reset socket, and the create takes
    /// another ([`Spares::take_fresh`]).
    pub fn take(self: &Arc<Self>) -> Result<(Spare, bool), RuntimeError> {
        let parked = loop {
            let next = self.lock().pop();
            match next {
                Some(s) if s.parked() => break Some(s),
                // Dropping its socket is all a dead one needs; the daemon's reaper collects it.
                Some(_) => continue,
                None => break None,
            }
        };
        self.refill();
        match parked {
            Some(s) => Ok((s, true)),
            None => Ok((Spare::start(&self.cfg)?, false)),
        }
    }

    /// An agent started now, for a create whose parked agent turned out to be dead.
    pub fn take_fresh(&self) -> Result<Spare, RuntimeError> {
        Spare::start(&self.cfg)
    }

    /// Pids of the agents parked now.
    pub fn pids(&self) -> Vec<u32> {
        self.lock().iter().map(|s| s.pid).collect()
    }

    /// Ends every parked agent (their sockets close) and parks no more; creates after this
    /// start their own.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.lock().clear();
    }

    /// Starts agents on a thread of its own until `want` are parked (one refill at a time).
    fn refill(self: &Arc<Self>) {
        if self.want == 0
            || self.closed.load(Ordering::SeqCst)
            || self.filling.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let me = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("agent-spares".into())
            .spawn(move || loop {
                // The runtime may be gone: then nothing more is started.
                let Some(me) = me.upgrade() else { return };
                if me.closed.load(Ordering::SeqCst) {
                    me.lock().clear();
                    return;
                }
                if me.lock().len() >= me.want {
                    me.filling.store(false, Ordering::SeqCst);
                    // A take between the check and the store found the refill still running.
                    if me.lock().len() >= me.want || me.filling.swap(true, Ordering::SeqCst) {
                        return;
                    }
                    continue;
                }
                match Spare::start(&me.cfg) {
                    Ok(s) => me.lock().push(s),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot start a spare agent");
                        me.filling.store(false, Ordering::SeqCst);
                        return;
                    }
                }
            });
        if spawned.is_err() {
            self.filling.store(false, Ordering::SeqCst);
        }
    }
}
