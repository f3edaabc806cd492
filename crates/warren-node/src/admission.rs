//! Admission: the node's final word on whether a new sandbox may start now (caps on starting
//! and held sandboxes, memory headroom), and the load summary a cluster placement reads.
//!
//! A refusal is `busy` (429) with a `retry_after`: the request was fine, the node is full for
//! now, and a gateway tries its next candidate. It never refuses a create that an idempotency
//! key answers from an earlier sandbox (nothing new starts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use warren_types::{ApiError, ErrorCode};

/// The node's admission limits.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionConfig {
    /// Most sandboxes starting at once.
    pub max_starting: u64,
    /// Most sandboxes held that are not starting (running, paused, stopped, failed).
    pub max_running: u64,
    /// Refuse new sandboxes while the host has less memory available than this, in MiB.
    pub min_free_memory_mb: u64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            max_starting: 64,
            max_running: 10_000,
            min_free_memory_mb: 256,
        }
    }
}

/// Counts sandboxes being started and decides admission.
#[derive(Debug)]
pub struct Admission {
    cfg: AdmissionConfig,
    starting: Arc<AtomicU64>,
    /// Where the host's available memory comes from (a fixed value in unit tests).
    memory: fn() -> Option<MemInfo>,
}

/// Host memory (`/proc/meminfo`, read by warren-sys).
pub use warren_runtime::procfs::MemInfo;

/// Holds one "starting" slot until dropped.
#[derive(Debug)]
pub struct StartingSlot {
    starting: Arc<AtomicU64>,
}

impl Drop for StartingSlot {
    fn drop(&mut self) {
        self.starting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Admission {
    pub fn new(cfg: AdmissionConfig) -> Self {
        Admission {
            cfg,
            starting: Arc::new(AtomicU64::new(0)),
            memory: meminfo,
        }
    }

    /// Same, reading host memory through `memory` (for tests).
    pub fn with_memory(cfg: AdmissionConfig, memory: fn() -> Option<MemInfo>) -> Self {
        Admission {
            memory,
            ..Admission::new(cfg)
        }
    }

    pub fn config(&self) -> &AdmissionConfig {
        &self.cfg
    }

    /// Sandboxes being started now.
    pub fn starting(&self) -> u64 {
        self.starting.load(Ordering::SeqCst)
    }

    /// The host's memory now (zeros where `/proc/meminfo` cannot be read).
    pub fn memory(&self) -> MemInfo {
        (self.memory)().unwrap_or_default()
    }

    /// Admits one new sandbox while `held` sandboxes exist (any state, the starting ones
    /// included), or says why not. The slot counts it as starting until dropped.
    pub fn admit(&self, held: usize) -> Result<StartingSlot, ApiError> {
        let starting = self.starting.fetch_add(1, Ordering::SeqCst);
        let slot = StartingSlot {
            starting: self.starting.clone(),
        };
        if starting >= self.cfg.max_starting {
            return Err(busy(
                format!(
                    "this node is starting {starting} sandboxes already (its limit is {})",
                    self.cfg.max_starting
                ),
                1,
            ));
        }
        let settled = (held as u64).saturating_sub(starting);
        if settled >= self.cfg.max_running {
            return Err(busy(
                format!(
                    "this node holds {settled} sandboxes (its limit is {})",
                    self.cfg.max_running
                ),
                5,
            ));
        }
        if let Some(mem) = (self.memory)() {
            if mem.available_mb() < self.cfg.min_free_memory_mb {
                return Err(busy(
                    format!(
                        "this node has {} MiB of memory available, less than the {} MiB it keeps free",
                        mem.available_mb(), self.cfg.min_free_memory_mb
                    ),
                    2,
                ));
            }
        }
        Ok(slot)
    }
}

fn busy(message: String, retry_after: u64) -> ApiError {
    let mut e = ApiError::new(ErrorCode::Busy, message);
    e.retry_after = Some(retry_after);
    e
}

/// The host's memory now, when `/proc/meminfo` can be read.
pub fn meminfo() -> Option<MemInfo> {
    MemInfo::read().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plenty() -> Option<MemInfo> {
        Some(MemInfo {
            total_kib: 4096 << 10,
            available_kib: 4096 << 10,
            ..MemInfo::default()
        })
    }

    fn scarce() -> Option<MemInfo> {
        Some(MemInfo {
            total_kib: 4096 << 10,
            available_kib: 100 << 10,
            ..MemInfo::default()
        })
    }

    #[test]
    fn caps_starting_and_held_sandboxes() {
        let a = Admission::with_memory(
            AdmissionConfig {
                max_starting: 2,
                max_running: 3,
                min_free_memory_mb: 256,
            },
            plenty,
        );
        let s1 = a.admit(1).unwrap();
        let s2 = a.admit(2).unwrap();
        let e = a.admit(3).unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy);
        assert_eq!(e.retry_after, Some(1));
        assert_eq!(a.starting(), 2, "a refused admission holds no slot");
        drop(s1);
        drop(s2);
        assert_eq!(a.starting(), 0);
        // Three settled sandboxes: the cap on running ones refuses the fourth.
        let e = a.admit(3).unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy);
        assert!(e.message.contains("holds 3"), "{}", e.message);
        assert!(a.admit(2).is_ok());
    }

    #[test]
    fn keeps_memory_headroom() {
        let a = Admission::with_memory(AdmissionConfig::default(), scarce);
        let e = a.admit(0).unwrap_err();
        assert_eq!(e.code, ErrorCode::Busy);
        assert_eq!(e.retry_after, Some(2));
        assert!(e.message.contains("100 MiB"), "{}", e.message);
    }

    #[test]
    fn reads_the_hosts_memory() {
        assert!(meminfo().is_some_and(|m| m.total_mb() > 0));
    }
}
