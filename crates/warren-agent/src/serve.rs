//! The agent's serving loop: one connection to the daemon at a time, many streams on it.
//!
//! If the daemon goes away (restart, crash), running background processes keep running and
//! the agent parks the daemon's end of a fresh socketpair on [`crate::RECONNECT_FD`], where a
//! restarted daemon takes it with `pidfd_getfd` and greets with `Init::Hello`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use warren_proto::{Call, Event, Frame, Init, InitReply, Kind, PROTOCOL_VERSION};
use warren_types::ErrorCode;

use crate::exec::Commands;
use crate::held::HeldCall;
use crate::reaper::Reaper;
use crate::wire::{event, Inbox, Out};

/// What the agent serves from: its commands, and in a function container its cells.
pub struct State {
    pub commands: Rc<Commands>,
    /// Set in a function container: its call environments.
    pub cells: Option<Rc<crate::cells::Cells>>,
}

/// The agent's shared state, made once per agent.
pub fn new_state() -> Rc<State> {
    Rc::new(State {
        commands: Rc::new(Commands::new(Reaper::start())),
        cells: None,
    })
}

pub fn run(
    ctl: std::os::unix::net::UnixStream,
    seccomp: bool,
    function: Option<&warren_proto::ContainerInit>,
) -> ! {
    if seccomp {
        if let Err(e) = warren_sys::seccomp::apply_sandbox_filter() {
            eprintln!("warren-agent: seccomp: {e}");
            std::process::exit(1);
        }
    }
    // A function container's agent takes the builder half of the policy before anything
    // else runs (see `warren_sys::seccomp::CellFilters`); each cell adds the other half.
    let cell_filters = match function.filter(|f| f.seccomp) {
        Some(_) => match warren_sys::seccomp::CellFilters::install_builder() {
            Ok(f) => Some(f),
            Err(e) => {
                eprintln!("warren-agent: seccomp: {e}");
                std::process::exit(1);
            }
        },
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async move {
        let reaper = Reaper::start();
        let state = Rc::new(State {
            commands: Rc::new(Commands::new(reaper.clone())),
            cells: function.map(|f| crate::cells::Cells::new(f, cell_filters, reaper.clone())),
        });
        if let Some(c) = &state.cells {
            c.refill();
        }
        ctl.set_nonblocking(true)
            .expect("nonblocking control socket");
        let mut conn = UnixStream::from_std(ctl).expect("control socket");
        loop {
            serve_conn(conn, state.clone()).await;
            conn = match park_for_reconnect().await {
                Some(c) => c,
                None => std::process::exit(1),
            };
        }
    });
    std::process::exit(0)
}

/// Parks a fresh socketpair end for a restarted daemon and waits for its `Hello`.
async fn park_for_reconnect() -> Option<UnixStream> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().ok()?;
    warren_sys::fd::dup_to(&theirs, crate::RECONNECT_FD).ok()?;
    drop(theirs);
    // dup2 cleared close-on-exec: without it every command started from now on would inherit
    // the daemon's end and could forge calls.
    let parked = warren_sys::fd::inherited(crate::RECONNECT_FD).ok()?;
    warren_sys::fd::set_cloexec(&parked, true).ok()?;
    std::mem::forget(parked);
    ours.set_nonblocking(true).ok()?;
    let mut conn = UnixStream::from_std(ours).ok()?;
    loop {
        let f = Frame::read_async(&mut conn).await.ok()?;
        if let Ok(Init::Hello { .. }) = f.parse::<Init>() {
            // The daemon holds its own copy now; ours would keep the socket alive forever.
            // SAFETY-free: closing by number through nix.
            let _ = nix::unistd::close(crate::RECONNECT_FD);
            let reply = Frame::json(
                0,
                Kind::Init,
                &InitReply::Ready {
                    version: PROTOCOL_VERSION,
                },
            );
            conn.write_all(&reply.encode()).await.ok()?;
            return Some(conn);
        }
    }
}

/// Serves one connection until the daemon goes away. Any byte stream will do: a socket for
/// containers, a virtio-serial port in a VM.
pub async fn serve_conn<S>(conn: S, state: Rc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(conn);
    let (out, mut out_rx) = mpsc::channel::<Frame>(256);
    let writer = tokio::task::spawn_local(async move {
        let mut buf = bytes::BytesMut::with_capacity(1 << 16);
        while let Some(f) = out_rx.recv().await {
            buf.clear();
            f.encode_into(&mut buf);
            while buf.len() < (1 << 20) {
                match out_rx.try_recv() {
                    Ok(f) => f.encode_into(&mut buf),
                    Err(_) => break,
                }
            }
            if wr.write_all(&buf).await.is_err() {
                return;
            }
        }
    });
    let streams: Rc<RefCell<HashMap<u32, mpsc::Sender<Frame>>>> = Rc::default();
    loop {
        let frame = match Frame::read_async(&mut rd).await {
            Ok(f) => f,
            Err(_) => break,
        };
        match frame.kind {
            Kind::Call => {
                let id = frame.stream;
                let call = match frame.parse::<Call>() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = event(
                            &out,
                            id,
                            &Event::error(ErrorCode::InvalidRequest, e.to_string()),
                        )
                        .await;
                        continue;
                    }
                };
                let (tx, rx) = mpsc::channel(32);
                streams.borrow_mut().insert(id, tx);
                let (out, state, streams) = (out.clone(), state.clone(), streams.clone());
                tokio::task::spawn_local(async move {
                    handle(call, id, rx, &out, &state).await;
                    streams.borrow_mut().remove(&id);
                });
            }
            Kind::Init => {
                if let Ok(Init::Hello { hostname, .. }) = frame.parse::<Init>() {
                    if let Some(h) = hostname {
                        let _ = warren_sys::ns::set_hostname(&h);
                    }
                    let _ = out
                        .send(Frame::json(
                            0,
                            Kind::Init,
                            &InitReply::Ready {
                                version: PROTOCOL_VERSION,
                            },
                        ))
                        .await;
                }
            }
            Kind::Stdin | Kind::Eof | Kind::Cancel | Kind::Credit | Kind::Control => {
                let tx = streams.borrow().get(&frame.stream).cloned();
                if let Some(tx) = tx {
                    let _ = tx.send(frame).await;
                }
            }
            Kind::Event | Kind::Stdout | Kind::Stderr | Kind::Part => {}
        }
    }
    // The daemon is gone: in-flight foreground calls see their inbox close and stop.
    streams.borrow_mut().clear();
    drop(out);
    writer.abort();
}

async fn handle(call: Call, id: u32, inbox: Inbox, out: &Out, state: &Rc<State>) {
    if let Some(cells) = &state.cells {
        // A function container runs nothing in the agent's own root: only calls, each in a
        // fresh environment.
        let ev = match call {
            Call::Ping => Event::Pong {
                version: PROTOCOL_VERSION,
                pid: std::process::id(),
            },
            Call::Invoke { spec } => {
                let ev = cells.invoke(spec, id, inbox, out).await;
                let _ = event(out, id, &ev).await;
                // The next cell is started once the answer is queued: the writer was woken
                // first, so the new cell's clone no longer runs ahead of the answer.
                cells.refill();
                return;
            }
            _ => Event::error(
                ErrorCode::InvalidRequest,
                "a function container serves only calls",
            ),
        };
        let _ = event(out, id, &ev).await;
        return;
    }
    let cmds = &state.commands;
    let ev = match call {
        Call::Ping => Event::Pong {
            version: PROTOCOL_VERSION,
            pid: std::process::id(),
        },
        Call::Exec { spec } => crate::exec::foreground(spec, id, inbox, out, cmds).await,
        Call::Spawn { spec } => crate::exec::background(spec, cmds).await,
        Call::ListProcs => Event::Procs {
            procs: cmds.procs.list(),
        },
        Call::Wait { pid, timeout_ms } => crate::exec::wait(pid, timeout_ms, id, out, cmds).await,
        Call::Kill { pid, signal } => crate::exec::kill(pid, signal, cmds),
        Call::Pty { spec, cols, rows } => {
            crate::exec::pty(spec, cols, rows, id, inbox, out, cmds).await
        }
        Call::ReadFile { path, window } => crate::files::read(&path, window, id, inbox, out).await,
        Call::WriteFile { path, mode, size } => crate::files::write(&path, mode, size, inbox).await,
        Call::ReadTar { path, window } => crate::tarball::read(&path, window, id, inbox, out).await,
        Call::WriteTar { path } => crate::tarball::write(&path, inbox).await,
        Call::Stat { path } => crate::files::stat(&path),
        Call::List { path, after, limit } => crate::files::list(&path, after.as_deref(), limit),
        Call::Mkdir {
            path,
            parents,
            mode,
        } => crate::files::mkdir(&path, parents, mode),
        Call::Remove { path, recursive } => crate::files::remove(&path, recursive),
        Call::Chmod { path, mode } => crate::files::chmod(&path, mode),
        Call::Network {
            config,
            resolv_conf,
        } => crate::guest_net::configure(config.as_ref(), resolv_conf.as_deref()),
        Call::Connect { port, window } => crate::ports::relay(port, window, id, inbox, out).await,
        Call::Invoke { .. } => Event::error(
            ErrorCode::InvalidRequest,
            "calls run only in function containers",
        ),
        Call::Held => return cmds.held.serve(HeldCall::List, id, out).await,
        Call::Collect { step } => return cmds.held.serve(HeldCall::Collect(step), id, out).await,
        Call::Release { step } => return cmds.held.serve(HeldCall::Release(step), id, out).await,
    };
    let _ = event(out, id, &ev).await;
}
