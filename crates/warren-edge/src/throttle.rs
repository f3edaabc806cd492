//! Slows down sources that keep presenting bad tokens: after a few free failures each further
//! one from the same address waits longer before its `401` (doubling, capped), so guessing
//! tokens over one connection or many costs time. A success or a quiet spell forgets the
//! source. The table is bounded; when full, the stalest sources are dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures answered at once before the slow-down starts.
pub const FREE_FAILURES: u32 = 3;
/// The first delay; each further failure doubles it.
pub const BASE_DELAY: Duration = Duration::from_millis(100);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// A source with no failure for this long starts afresh.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Most sources remembered at once.
const MAX_SOURCES: usize = 16_384;

/// Where a request came from, as far as the slow-down is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Ip(IpAddr),
    /// A Unix-socket peer, by user id.
    Uid(u32),
    Unknown,
}

/// The delay before answering the `failures`-th consecutive failure of a source.
pub fn delay_for(failures: u32) -> Duration {
    if failures <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES - 1).min(16);
    (BASE_DELAY * 2u32.pow(doublings)).min(MAX_DELAY)
}

#[derive(Debug, Default)]
pub struct Throttle {
    sources: Mutex<HashMap<Source, (u32, Instant)>>,
}

impl Throttle {
    /// Records a failure of `source` at `now`; answers how long to wait before refusing it.
    pub fn fail(&self, source: Source, now: Instant) -> Duration {
        let mut map = self.sources.lock().expect("throttle lock");
        if map.len() >= MAX_SOURCES && !map.contains_key(&source) {
            map.retain(|_, (_, last)| now.duration_since(*last) < FORGET_AFTER);
            if map.len() >= MAX_SOURCES {
                // Still full of active sources: drop the stalest half.
                let mut lasts: Vec<Instant> = map.values().map(|(_, l)| *l).collect();
                lasts.sort();
                let cut = lasts[lasts.len() / 2];
                map.retain(|_, (_, last)| *last > cut);
            }
        }
        let e = map.entry(source).or_insert((0, now));
        if now.duration_since(e.1) >= FORGET_AFTER {
            e.0 = 0;
        }
        e.0 = e.0.saturating_add(1);
        e.1 = now;
        delay_for(e.0)
    }

    /// A source authenticated: it starts afresh.
    pub fn succeed(&self, source: Source) {
        let mut map = self.sources.lock().expect("throttle lock");
        if !map.is_empty() {
            map.remove(&source);
        }
    }

    /// Consecutive failures remembered for `source`.
    pub fn failures(&self, source: Source) -> u32 {
        let map = self.sources.lock().expect("throttle lock");
        map.get(&source).map(|(n, _)| *n).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_then_cap() {
        assert_eq!(delay_for(1), Duration::ZERO);
        assert_eq!(delay_for(FREE_FAILURES), Duration::ZERO);
        assert_eq!(delay_for(FREE_FAILURES + 1), BASE_DELAY);
        assert_eq!(delay_for(FREE_FAILURES + 2), BASE_DELAY * 2);
        assert_eq!(delay_for(FREE_FAILURES + 3), BASE_DELAY * 4);
        assert_eq!(delay_for(1000), MAX_DELAY);
        assert_eq!(delay_for(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn sources_are_counted_apart_and_forgiven() {
        let t = Throttle::default();
        let a = Source::Ip("192.0.2.1".parse().unwrap());
        let b = Source::Ip("192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(t.fail(a, t0), Duration::ZERO);
        }
        assert_eq!(t.fail(a, t0), BASE_DELAY);
        assert_eq!(
            t.fail(b, t0),
            Duration::ZERO,
            "another source is not slowed"
        );
        // Quiet for long enough: a fresh start.
        assert_eq!(t.fail(a, t0 + FORGET_AFTER), Duration::ZERO);
        assert_eq!(t.failures(a), 1);
        // A success forgets the source.
        t.fail(a, t0 + FORGET_AFTER);
        t.succeed(a);
        assert_eq!(t.failures(a), 0);
    }

    #[test]
    fn the_table_stays_bounded() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..(MAX_SOURCES as u32 + 10) {
            t.fail(Source::Uid(i), t0 + Duration::from_millis(i as u64));
        }
        assert!(t.sources.lock().unwrap().len() <= MAX_SOURCES);
        // The newest source is remembered.
        assert_eq!(t.failures(Source::Uid(MAX_SOURCES as u32 + 9)), 1);
    }
}
