//! The agent side of a function container: keeps the next call environment (a `cell`)
//! ready and relays each `Invoke` to a fresh one.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use warren_proto::{Call, ContainerInit, Event, Frame, Init, InitReply, InvokeSpec, Kind};
use warren_types::ErrorCode;

use crate::error::AgentError;
use crate::spare::Spare;
use crate::wire::{Inbox, Out};

/// Longest a cell may take to build its root.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// A cell that said `Ready` and waits for its call.
struct ReadyCell {
    pid: u32,
    conn: UnixStream,
    exit: tokio::sync::oneshot::Receiver<crate::run::Exit>,
}

/// The container's Python zygote (see `zygote`).
struct Zygote {
    pid: u32,
    sock: std::os::fd::OwnedFd,
    exit: tokio::sync::oneshot::Receiver<crate::run::Exit>,
}

/// The function containers' call environments.
pub struct Cells {
    config: ContainerInit,
    /// The finish half of the seccomp policy (the agent holds the builder half); each cell
    /// installs it on itself.
    filters: Option<warren_sys::seccomp::CellFilters>,
    reaper: Rc<crate::reaper::Reaper>,
    /// The cell waiting for the next call.
    spare: Spare<ReadyCell>,
    /// The zygote, when the pool has an interpreter and one could be started.
    zygote: std::cell::RefCell<Option<Zygote>>,
    /// Zygotes started so far (at most `zygote::MAX_STARTS`).
    zygote_starts: std::cell::Cell<u32>,
}

impl Cells {
    pub fn new(
        config: &ContainerInit,
        filters: Option<warren_sys::seccomp::CellFilters>,
        reaper: Rc<crate::reaper::Reaper>,
    ) -> Rc<Cells> {
        Rc::new(Cells {
            filters,
            config: crate::cell::cell_config(config),
            reaper,
            spare: Spare::default(),
            zygote: Default::default(),
            zygote_starts: Default::default(),
        })
    }

    /// Starts the zygote: a child in new mount, ipc and uts namespaces that becomes the
    /// pool's interpreter (`zygote::main`). Does not wait for it: a cell waits for its
    /// interpreter, and starts its own when the zygote gives none.
    fn start_zygote(&self) -> Result<Zygote, AgentError> {
        let (ours, theirs) = warren_sys::fd::seqpacket_pair()?;
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(AgentError::io("/dev/null"))?;
        use warren_sys::ns::Namespaces as N;
        let flags = N::CLONE_NEWNS | N::CLONE_NEWIPC | N::CLONE_NEWUTS;
        let pid = match warren_sys::clone::clone_checked(flags)? {
            warren_sys::process::Forked::Child => {
                let ctl = warren_proto::CONTROL_FD;
                if warren_sys::clone::reset_child(theirs.as_raw_fd(), ctl, null.as_raw_fd())
                    .is_err()
                {
                    std::process::exit(127);
                }
                std::mem::forget(theirs);
                std::mem::forget(ours);
                std::mem::forget(null);
                crate::zygote::main(&self.config)
            }
            warren_sys::process::Forked::Parent { child } => child,
        };
        drop(theirs);
        Ok(Zygote {
            pid,
            sock: ours,
            exit: self.reaper.watch(pid),
        })
    }

    /// A new cell's end of the zygote's socket, the other end handed to the zygote; starts
    /// the zygote when there is none or it died. `None` without a zygote.
    fn zygote_end(&self) -> Option<std::os::fd::OwnedFd> {
        self.config.function.as_ref()?.interpreter.as_ref()?;
        for _ in 0..2 {
            let mut z = self.zygote.borrow_mut();
            let alive = z.as_mut().is_some_and(|h| {
                matches!(
                    h.exit.try_recv(),
                    Err(tokio::sync::oneshot::error::TryRecvError::Empty)
                )
            });
            if !alive {
                *z = None;
                if self.zygote_starts.get() >= crate::zygote::MAX_STARTS {
                    return None;
                }
                self.zygote_starts.set(self.zygote_starts.get() + 1);
                match self.start_zygote() {
                    Ok(h) => *z = Some(h),
                    Err(e) => {
                        eprintln!("warren-agent: zygote: {e}");
                        return None;
                    }
                }
            }
            let h = z.as_ref()?;
            let (cell, theirs) = warren_sys::fd::seqpacket_pair().ok()?;
            match warren_sys::fd::send_fds_now(&h.sock, b"C", &[theirs.as_raw_fd()]) {
                // Above the descriptors the cell's child puts in place (`ZYGOTE_FD` and below).
                Ok(()) => return warren_sys::fd::dup_above(&cell, 16).ok(),
                Err(_) => {
                    // The interpreter died or is stuck (the calls it forked go on either way): the
                    // next round starts another.
                    let _ = warren_sys::process::kill(h.pid, libc::SIGKILL);
                    *z = None;
                }
            }
        }
        None
    }

    /// Starts one cell and waits until it is ready.
    async fn start(&self) -> Result<ReadyCell, AgentError> {
        let zygote = self.zygote_end();
        let (ours, theirs) = warren_sys::fd::socketpair()?;
        let null = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
            .map_err(AgentError::io("/dev/null"))?;
        use warren_sys::ns::Namespaces as N;
        let flags = N::CLONE_NEWNS | N::CLONE_NEWPID | N::CLONE_NEWIPC | N::CLONE_NEWUTS;
        // The agent runs on one thread (checked by the clone), so a plain fork-like clone is
        // fine; the child never returns to the runtime.
        let pid = match warren_sys::clone::clone_checked(flags)? {
            warren_sys::process::Forked::Child => {
                let ctl = warren_proto::CONTROL_FD;
                let mut keep = vec![(theirs.as_raw_fd(), ctl)];
                if let Some(z) = &zygote {
                    keep.push((z.as_raw_fd(), crate::zygote::ZYGOTE_FD));
                }
                if warren_sys::clone::reset_child_keeping(&keep, null.as_raw_fd()).is_err() {
                    std::process::exit(127);
                }
                std::mem::forget(theirs);
                std::mem::forget(ours);
                std::mem::forget(null);
                std::mem::forget(zygote);
                let Ok(fd) = warren_sys::fd::inherited(ctl) else {
                    std::process::exit(127)
                };
                crate::cell::main(
                    std::os::unix::net::UnixStream::from(fd),
                    self.filters.as_ref(),
                )
            }
            warren_sys::process::Forked::Parent { child } => child,
        };
        drop(theirs);
        drop(zygote);
        let exit = self.reaper.watch(pid);
        let kill = || {
            let _ = warren_sys::process::kill(pid, libc::SIGKILL);
        };
        let std = std::os::unix::net::UnixStream::from(ours);
        let conn = std
            .set_nonblocking(true)
            .and_then(|_| UnixStream::from_std(std))
            .map_err(|e| {
                kill();
                AgentError::io("cell socket")(e)
            });
        let mut conn = conn?;
        let init = Frame::json(
            0,
            Kind::Init,
            &Init::Container {
                version: warren_proto::PROTOCOL_VERSION,
                config: Box::new(self.config.clone()),
            },
        );
        let answer = async {
            init.write_async(&mut conn)
                .await
                .map_err(AgentError::frame("start message"))?;
            let f = Frame::read_async(&mut conn)
                .await
                .map_err(AgentError::frame("ready message"))?;
            match f.parse::<InitReply>() {
                Ok(InitReply::Ready { .. }) => Ok(()),
                Ok(InitReply::Failed { message }) => Err(AgentError::Setup(message)),
                other => Err(AgentError::Protocol(format!("unexpected {other:?}"))),
            }
        };
        match tokio::time::timeout(READY_TIMEOUT, answer).await {
            Ok(Ok(())) => Ok(ReadyCell { pid, conn, exit }),
            Ok(Err(e)) => {
                kill();
                let status = tokio::time::timeout(Duration::from_secs(1), exit).await;
                Err(AgentError::CellStart {
                    source: Box::new(e),
                    status: format!("{status:?}"),
                })
            }
            Err(_) => {
                kill();
                Err(AgentError::CellTimeout)
            }
        }
    }

    /// Makes sure a ready cell waits for the next call (in the background).
    pub fn refill(self: &Rc<Self>) {
        if !self.spare.begin() {
            return;
        }
        let me = self.clone();
        tokio::task::spawn_local(async move {
            let cell = match me.start().await {
                Ok(c) => Some(c),
                Err(e) => {
                    eprintln!("warren-agent: {e}");
                    None
                }
            };
            if let Some(old) = me.spare.made(cell) {
                let _ = warren_sys::process::kill(old.pid, libc::SIGKILL);
            }
        });
    }

    /// The ready cell; a call that comes while the next one is still being built waits for
    /// it (it has a head start) instead of building a second one. True in the second field
    /// when the call had to wait.
    async fn take(&self) -> Result<(ReadyCell, bool), AgentError> {
        if let Some(c) = self.spare.ready() {
            return Ok((c, false));
        }
        match self.spare.take().await {
            Some(c) => Ok((c, true)),
            None => self.start().await.map(|c| (c, true)),
        }
    }

    /// Runs one call in a fresh cell, relaying frames both ways; returns the final event. The
    /// caller starts the next cell ([`Cells::refill`]) after it has queued the answer.
    pub async fn invoke(
        self: &Rc<Self>,
        spec: InvokeSpec,
        id: u32,
        mut inbox: Inbox,
        out: &Out,
    ) -> Event {
        let t0 = std::time::Instant::now();
        let (cell, waited) = match self.take().await {
            Ok(c) => c,
            Err(e) => return Event::error(e.code(), e.to_string()),
        };
        // The daemon's pool grows when calls keep waiting for their cells. A call that found
        // its cell ready sends nothing (the daemon counts that as no wait): one frame and one
        // wake-up of the daemon less on the common path.
        let waited = waited.then(|| Event::CellWaited {
            us: t0.elapsed().as_micros() as u64,
        });
        if let Some(w) = waited {
            if out.send(Frame::json(id, Kind::Event, &w)).await.is_err() {
                let _ = warren_sys::process::kill(cell.pid, libc::SIGKILL);
                return Event::error(ErrorCode::Internal, "the daemon went away");
            }
        }
        let ReadyCell { pid, conn, exit } = cell;
        let (mut rd, mut wr) = conn.into_split();
        // Frames are read by a task of their own: a frame read is not cancel-safe, so it
        // must not race the daemon's frames in a `select!`.
        let (cell_tx, mut cell_rx) = tokio::sync::mpsc::channel::<Frame>(64);
        let reader = tokio::task::spawn_local(async move {
            while let Ok(f) = Frame::read_async(&mut rd).await {
                if cell_tx.send(f).await.is_err() {
                    break;
                }
            }
        });
        let mut ev = None;
        let call = Frame::json(1, Kind::Call, &Call::Invoke { spec }).encode();
        if wr.write_all(&call).await.is_ok() {
            let mut cell_open = true;
            loop {
                tokio::select! {
                    f = cell_rx.recv() => match f {
                        Some(mut f) => {
                            f.stream = id;
                            if f.kind == Kind::Event {
                                match f.parse::<Event>() {
                                    Ok(e) if e.is_final() => { ev = Some(e); break; }
                                    // The daemon has no use for a call's pid (it is the
                                    // cell's own): not relayed.
                                    Ok(Event::Started { .. }) => {}
                                    Ok(_) => { let _ = out.send(f).await; }
                                    Err(_) => {}
                                }
                            } else if out.send(f).await.is_err() {
                                break;
                            }
                        }
                        None => break,
                    },
                    f = inbox.recv(), if cell_open => match f {
                        Some(mut f) => {
                            f.stream = 1;
                            // A cell that already finished (and closed its end) may still
                            // have its result queued: keep reading it.
                            if wr.write_all(&f.encode()).await.is_err() { cell_open = false; }
                        }
                        // The daemon gave up on the call.
                        None => break,
                    },
                }
            }
        }
        reader.abort();
        // One call per cell: whatever is left of it goes now.
        let _ = warren_sys::process::kill(pid, libc::SIGKILL);
        match ev {
            Some(ev) => ev,
            None => {
                let status = tokio::time::timeout(Duration::from_secs(1), exit).await;
                Event::error(
                    ErrorCode::Internal,
                    format!("the call environment ended without a result ({status:?})"),
                )
            }
        }
    }
}
