//! Host uid/gid ranges: each container sandbox gets 65,536 host ids of its own, so nothing one
//! sandbox's processes own (files, processes, IPC) belongs to another's ids.
//!
//! The node hands out range `k` = host ids `base + k × 65536 ..` (k in `0..slots`) and takes
//! it back when the sandbox is gone (its processes are dead and its writable layer deleted).
//! The range is in the sandbox's record (`ContainerRecord::id_base`), so a restarted daemon
//! re-adopts it before any create can take it again.

use std::collections::BTreeSet;
use std::sync::Mutex;

use crate::{AdoptError, ConfigError, RuntimeError, StartCause};

/// Ids in one sandbox's range.
pub const RANGE: u32 = 65_536;

/// Where the ranges come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdPoolConfig {
    /// Host id of range 0's root. A multiple of 65,536.
    pub base: u32,
    /// Number of ranges (the most container sandboxes the node can hold at once).
    pub slots: u32,
}

impl Default for IdPoolConfig {
    fn default() -> Self {
        // 2^24 up to 2^24 + 16,384 × 65,536 = 1,090,519,040: above the ids distributions
        // give users and the usual subordinate ranges (100,000 + n × 65,536 for a few users),
        // below 2^31.
        IdPoolConfig {
            base: 1 << 24,
            slots: 16_384,
        }
    }
}

/// Refuses a pool that overlaps the uids sandboxes' user namespaces are owned by
/// (`owner_base` + [`super::OWNER_UIDS`], see [`super::owner_uid`]): a sandbox's ids must
/// never be another sandbox's namespace owner, which holds every capability over it.
pub fn disjoint_from_owners(
    cfg: &IdPoolConfig,
    owner_base: Option<u32>,
) -> Result<(), RuntimeError> {
    let Some(o) = owner_base else {
        return Ok(());
    };
    let (start, end) = (
        u64::from(cfg.base),
        u64::from(cfg.base) + u64::from(cfg.slots) * u64::from(RANGE),
    );
    let (o_start, o_end) = (u64::from(o), u64::from(o) + u64::from(super::OWNER_UIDS));
    if start < o_end && o_start < end {
        return Err(StartCause::Config(ConfigError::IdPoolOverlapsOwners {
            start,
            end,
            owner_start: o_start,
            owner_end: o_end,
        })
        .into());
    }
    Ok(())
}

/// The node's pool of ranges.
#[derive(Debug)]
pub struct IdPool {
    cfg: IdPoolConfig,
    used: Mutex<BTreeSet<u32>>,
    /// Where the next search starts: a freed range is handed out again as late as possible.
    next: Mutex<u32>,
}

impl IdPool {
    pub fn new(cfg: IdPoolConfig) -> Result<IdPool, RuntimeError> {
        let end = cfg.base as u64 + cfg.slots as u64 * RANGE as u64;
        if !cfg.base.is_multiple_of(RANGE) || cfg.slots == 0 || end > u32::MAX as u64 {
            return Err(StartCause::Config(ConfigError::IdPoolShape {
                base: cfg.base,
                slots: cfg.slots,
                range: RANGE,
            })
            .into());
        }
        Ok(IdPool {
            cfg,
            used: Mutex::new(BTreeSet::new()),
            next: Mutex::new(0),
        })
    }

    fn used(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a free range; returns the host id of its root.
    pub fn take(&self) -> Result<u32, RuntimeError> {
        let mut used = self.used();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..self.cfg.slots {
            let k = (*next + i) % self.cfg.slots;
            if used.insert(k) {
                *next = (k + 1) % self.cfg.slots;
                return Ok(self.cfg.base + k * RANGE);
            }
        }
        Err(RuntimeError::NoIds {
            ranges: self.cfg.slots,
        })
    }

    /// Marks the range whose root is `base` as taken (a sandbox re-adopted after a restart).
    /// Refuses one outside the pool or taken already.
    pub fn adopt(&self, base: u32) -> Result<(), RuntimeError> {
        let k = self
            .slot(base)
            .ok_or_else(|| RuntimeError::Adopt(AdoptError::IdNotInPool { base }))?;
        if !self.used().insert(k) {
            return Err(AdoptError::IdHeld { base }.into());
        }
        Ok(())
    }

    /// Gives the range whose root is `base` back.
    pub fn free(&self, base: u32) {
        if let Some(k) = self.slot(base) {
            self.used().remove(&k);
        }
    }

    /// Ranges in use.
    pub fn in_use(&self) -> usize {
        self.used().len()
    }

    fn slot(&self, base: u32) -> Option<u32> {
        let off = base.checked_sub(self.cfg.base)?;
        (off % RANGE == 0 && off / RANGE < self.cfg.slots).then_some(off / RANGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(slots: u32) -> IdPool {
        IdPool::new(IdPoolConfig {
            base: 1 << 24,
            slots,
        })
        .unwrap()
    }

    #[test]
    fn ranges_are_disjoint_recycled_late_and_run_out() {
        let p = pool(3);
        let a = p.take().unwrap();
        let b = p.take().unwrap();
        assert_eq!(a, 1 << 24);
        assert_eq!(b, a + RANGE);
        p.free(a);
        // The freed range comes back only after the untouched one.
        assert_eq!(p.take().unwrap(), b + RANGE);
        assert_eq!(p.take().unwrap(), a);
        assert!(p.take().is_err(), "a fourth range out of three");
        assert_eq!(p.in_use(), 3);
    }

    #[test]
    fn adoption_takes_the_recorded_range_once() {
        let p = pool(4);
        let r = (1 << 24) + 2 * RANGE;
        p.adopt(r).unwrap();
        assert!(p.adopt(r).is_err(), "one range adopted twice");
        assert!(p.adopt(r + 1).is_err(), "not a range's root");
        assert!(p.adopt(100_000).is_err(), "outside the pool");
        let taken: Vec<u32> = (0..3).map(|_| p.take().unwrap()).collect();
        assert!(!taken.contains(&r), "{taken:?}");
    }

    #[test]
    fn pools_stay_clear_of_namespace_owners() {
        let d = IdPoolConfig::default();
        disjoint_from_owners(&d, Some(1 << 31)).unwrap();
        disjoint_from_owners(&d, None).unwrap();
        assert!(disjoint_from_owners(&d, Some(1 << 25)).is_err());
        assert!(disjoint_from_owners(&d, Some(0)).is_err());
    }

    #[test]
    fn bad_pools_are_refused() {
        assert!(IdPool::new(IdPoolConfig {
            base: 100_000,
            slots: 4
        })
        .is_err());
        assert!(IdPool::new(IdPoolConfig {
            base: 1 << 24,
            slots: 0
        })
        .is_err());
        assert!(IdPool::new(IdPoolConfig {
            base: 1 << 31,
            slots: 1 << 15
        })
        .is_err());
    }
}
