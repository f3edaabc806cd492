//! Held commands: the foreground commands of logged steps, whose results the agent keeps
//! until the daemon has logged them.
//!
//! A step's command must run once, whatever happens to the daemon. So a command sent with a
//! [`Hold`] runs to its end even when its caller (the daemon) goes away, and its result (the
//! output under its cap and the exit) stays here until the daemon says the step is logged
//! (`Release`). A restarted daemon asks what is held (`Held`), collects each result
//! (`Collect`, waiting for a command still running) and logs it as the step's entry, so the
//! caller's retry answers it instead of running the command again.
//!
//! Owns only those results; never runs or kills anything.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use tokio::sync::Notify;
use warren_proto::{Event, Frame, HeldStep, Hold, Kind};
use warren_types::{ErrorCode, ExitInfo};

use crate::wire::{event, Out};

/// Most results held at once; past it the oldest ended ones are forgotten (a daemon that
/// never releases, e.g. one that does not know of holds, cannot grow the agent for ever).
const MAX_HELD: usize = 256;
/// Output frames of a collected result.
const CHUNK: usize = 256 * 1024;

/// One held command: what it printed (under its cap) and how it ended.
pub struct HeldRun {
    note: String,
    out: RefCell<Vec<u8>>,
    err: RefCell<Vec<u8>>,
    /// How it ended, and whether the run was disturbed (its stdin cut off by the daemon's
    /// going away).
    end: Cell<Option<(ExitInfo, bool)>>,
    done: Notify,
}

impl HeldRun {
    /// Keeps a copy of output that went (or would have gone) to the daemon.
    pub fn keep(&self, kind: Kind, data: &[u8]) {
        let buf = if kind == Kind::Stderr {
            &self.err
        } else {
            &self.out
        };
        buf.borrow_mut().extend_from_slice(data);
    }

    /// The command ended with `ev` (its final event).
    pub fn end(&self, ev: &Event, disturbed: bool) {
        let exit = match ev {
            Event::Exited(x) => *x,
            _ => ExitInfo {
                signal: Some(libc::SIGKILL),
                ..Default::default()
            },
        };
        self.end.set(Some((exit, disturbed)));
        self.done.notify_waiters();
    }
}

/// The held commands of one agent, by step.
#[derive(Default)]
pub struct Held {
    map: RefCell<BTreeMap<u64, Rc<HeldRun>>>,
}

impl Held {
    /// Starts holding the command of `hold` (a step sent again replaces its old result).
    pub fn start(&self, hold: &Hold) -> Rc<HeldRun> {
        let run = Rc::new(HeldRun {
            note: hold.note.clone(),
            out: RefCell::default(),
            err: RefCell::default(),
            end: Cell::new(None),
            done: Notify::new(),
        });
        let mut map = self.map.borrow_mut();
        while map.len() >= MAX_HELD {
            let oldest = map
                .iter()
                .find(|(_, r)| r.end.get().is_some())
                .map(|(s, _)| *s);
            match oldest {
                Some(s) => map.remove(&s),
                None => break,
            };
        }
        map.insert(hold.step, run.clone());
        run
    }

    /// What is held.
    pub fn list(&self) -> Event {
        let steps = self
            .map
            .borrow()
            .iter()
            .map(|(step, r)| HeldStep {
                step: *step,
                note: r.note.clone(),
                done: r.end.get().is_some(),
            })
            .collect();
        Event::Held { steps }
    }

    /// Sends the result of held `step` on stream `id` once its command has ended: its
    /// output as frames, then its final event.
    pub async fn collect(&self, step: u64, id: u32, out: &Out) -> Event {
        let Some(run) = self.map.borrow().get(&step).cloned() else {
            return Event::error(
                ErrorCode::NotFound,
                format!("no held command of step {step}"),
            );
        };
        let (exit, disturbed) = loop {
            let ended = run.done.notified();
            if let Some(end) = run.end.get() {
                break end;
            }
            ended.await;
        };
        for (kind, buf) in [(Kind::Stdout, &run.out), (Kind::Stderr, &run.err)] {
            let data = buf.borrow().clone();
            for chunk in data.chunks(CHUNK) {
                if out
                    .send(Frame::new(id, kind, chunk.to_vec()))
                    .await
                    .is_err()
                {
                    return Event::Done;
                }
            }
        }
        if disturbed {
            Event::HeldExited(exit)
        } else {
            Event::Exited(exit)
        }
    }

    /// Forgets held `step`.
    pub fn release(&self, step: u64) -> Event {
        self.map.borrow_mut().remove(&step);
        Event::Done
    }

    /// Answers `Held`, `Collect` or `Release` on stream `id`.
    pub async fn serve(&self, call: HeldCall, id: u32, out: &Out) {
        let ev = match call {
            HeldCall::List => self.list(),
            HeldCall::Collect(step) => self.collect(step, id, out).await,
            HeldCall::Release(step) => self.release(step),
        };
        let _ = event(out, id, &ev).await;
    }
}

/// The calls on held commands.
pub enum HeldCall {
    List,
    Collect(u64),
    Release(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn hold(step: u64) -> Hold {
        Hold {
            step,
            note: format!("note {step}"),
        }
    }

    #[test]
    fn a_held_result_is_listed_collected_after_its_end_and_released() {
        rt().block_on(async {
            let local = tokio::task::LocalSet::new();
            local
                .run_until(async {
                    let held = Rc::new(Held::default());
                    let run = held.start(&hold(4));
                    run.keep(Kind::Stdout, b"one ");
                    run.keep(Kind::Stderr, b"warn");
                    let Event::Held { steps } = held.list() else {
                        panic!()
                    };
                    assert_eq!(
                        steps,
                        vec![HeldStep {
                            step: 4,
                            note: "note 4".into(),
                            done: false
                        }]
                    );
                    // A collect waits for the end.
                    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
                    let h = held.clone();
                    let waiter =
                        tokio::task::spawn_local(async move { h.collect(4, 9, &tx).await });
                    tokio::task::yield_now().await;
                    assert!(!waiter.is_finished());
                    run.keep(Kind::Stdout, b"two");
                    run.end(
                        &Event::Exited(ExitInfo {
                            exit_code: Some(3),
                            ..Default::default()
                        }),
                        false,
                    );
                    let ev = waiter.await.unwrap();
                    assert!(matches!(ev, Event::Exited(x) if x.exit_code == Some(3)));
                    let f = rx.recv().await.unwrap();
                    assert_eq!(
                        (f.stream, f.kind, &f.payload[..]),
                        (9, Kind::Stdout, &b"one two"[..])
                    );
                    let f = rx.recv().await.unwrap();
                    assert_eq!((f.kind, &f.payload[..]), (Kind::Stderr, &b"warn"[..]));
                    assert!(matches!(held.release(4), Event::Done));
                    assert!(matches!(
                        held.collect(4, 9, &tokio::sync::mpsc::channel(1).0).await,
                        Event::Error {
                            code: ErrorCode::NotFound,
                            ..
                        }
                    ));
                })
                .await
        });
    }

    #[test]
    fn a_disturbed_run_is_collected_as_such_and_the_table_is_bounded() {
        rt().block_on(async {
            let held = Held::default();
            let run = held.start(&hold(1));
            run.end(&Event::Exited(ExitInfo::default()), true);
            let (tx, _rx) = tokio::sync::mpsc::channel(16);
            assert!(matches!(
                held.collect(1, 1, &tx).await,
                Event::HeldExited(_)
            ));
            for s in 2..(MAX_HELD as u64 + 50) {
                held.start(&hold(s)).end(&Event::Done, false);
            }
            assert_eq!(held.map.borrow().len(), MAX_HELD);
            assert!(
                !held.map.borrow().contains_key(&1),
                "the oldest ended results go first"
            );
        });
    }
}
