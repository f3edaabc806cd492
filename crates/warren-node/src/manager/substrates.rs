//! The runtimes a manager starts sandboxes with, one per substrate served, and whether the
//! daemon is stopping (then the reaper and lost-agent watchers stand down).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use warren_runtime::Runtime;
use warren_types::Substrate;

use crate::error::NodeError;

/// The runtimes of a node, one per substrate served.
pub struct Substrates {
    runtimes: Vec<Arc<dyn Runtime>>,
    /// Set by [`super::Manager::shutdown`]: the daemon is going away, sandboxes are not.
    stopping: AtomicBool,
}

impl std::fmt::Debug for Substrates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Substrates")
            .field("served", &self.served())
            .finish()
    }
}

impl Substrates {
    pub(super) fn new(runtimes: Vec<Arc<dyn Runtime>>) -> Substrates {
        Substrates {
            runtimes,
            stopping: AtomicBool::new(false),
        }
    }

    /// The runtimes, one per substrate served.
    pub fn runtimes(&self) -> &[Arc<dyn Runtime>] {
        &self.runtimes
    }

    /// The substrates this node serves. `function` is served wherever containers are (see
    /// [`Substrates::runtime_for`]).
    pub fn served(&self) -> Vec<Substrate> {
        let mut out: Vec<Substrate> = self.runtimes.iter().map(|r| r.substrate()).collect();
        if out.contains(&Substrate::Container) && !out.contains(&Substrate::Function) {
            out.push(Substrate::Function);
        }
        out
    }

    /// The runtime that starts sandboxes of substrate `s`.
    pub(crate) fn runtime_for(&self, s: Substrate) -> Result<Arc<dyn Runtime>, NodeError> {
        // A `function` sandbox made through the sandbox API is a container started by the
        // same runtime as the warm pools (its files and processes persist between its
        // commands); one-shot calls that each start fresh go through `/v1/functions/call`.
        let s = if s == Substrate::Function && !self.runtimes.iter().any(|r| r.substrate() == s) {
            Substrate::Container
        } else {
            s
        };
        self.runtimes
            .iter()
            .find(|r| r.substrate() == s)
            .cloned()
            .ok_or_else(|| NodeError::UnsupportedSubstrate {
                requested: s,
                served: self
                    .served()
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Marks the daemon as stopping and lets every runtime know.
    pub(super) fn shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        for r in &self.runtimes {
            r.shutdown();
        }
    }

    /// True once the daemon is stopping.
    pub(crate) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}
