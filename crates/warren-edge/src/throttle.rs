//! Slows down bad tokens: after a few free failures each further one waits longer before its
//! `401` (doubling, capped). Failures are counted three ways, and a refusal waits as long as
//! the worst of them asks: per source address (many guesses over one or many connections),
//! per token prefix (one token family guessed from many addresses), and per tenant that the
//! source last authenticated as (a caller holding one good token cannot spread guesses over
//! addresses, nor wipe its count with a good request: a success forgives nothing, only a
//! quiet spell does). The tables are bounded; when full, the stalest entries are dropped.
//! Refusals are logged at most once per [`LOG_EVERY`], with how many were not.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures answered at once before the slow-down starts.
pub const FREE_FAILURES: u32 = 3;
/// The first delay; each further failure doubles it.
pub const BASE_DELAY: Duration = Duration::from_millis(100);
/// The longest delay.
pub const MAX_DELAY: Duration = Duration::from_secs(5);
/// A key with no failure for this long starts afresh.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);
/// Least time between two log lines about refused tokens.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Characters of a presented token that make its prefix.
pub const PREFIX_CHARS: usize = 8;
/// Most keys remembered at once (and most sources remembered with their tenant).
const MAX_KEYS: usize = 16_384;

/// Where a request came from, as far as the slow-down is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Ip(IpAddr),
    /// A Unix-socket peer, by user id.
    Uid(u32),
    Unknown,
}

/// What failures are counted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Source(Source),
    /// A hash of the token's first [`PREFIX_CHARS`] characters (the token is never kept).
    Prefix(u64),
    Tenant(String),
}

/// The delay before answering the `failures`-th failure of a key.
pub fn delay_for(failures: u32) -> Duration {
    if failures <= FREE_FAILURES {
        return Duration::ZERO;
    }
    let doublings = (failures - FREE_FAILURES - 1).min(16);
    (BASE_DELAY * 2u32.pow(doublings)).min(MAX_DELAY)
}

fn prefix_key(token: &str) -> Key {
    let prefix: String = token.chars().take(PREFIX_CHARS).collect();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    prefix.hash(&mut h);
    Key::Prefix(h.finish())
}

#[derive(Debug, Default)]
struct Tables {
    failures: HashMap<Key, (u32, Instant)>,
    /// The tenant each source last authenticated as.
    tenants: HashMap<Source, (String, Instant)>,
    log: Option<(Instant, u64)>,
}

/// Bounds `map` to [`MAX_KEYS`] before an insert of a new key: drops entries older than
/// [`FORGET_AFTER`], then the stalest half.
fn bound<K: Eq + Hash, V>(map: &mut HashMap<K, V>, now: Instant, last: impl Fn(&V) -> Instant) {
    if map.len() < MAX_KEYS {
        return;
    }
    map.retain(|_, v| now.duration_since(last(v)) < FORGET_AFTER);
    if map.len() >= MAX_KEYS {
        let mut lasts: Vec<Instant> = map.values().map(&last).collect();
        lasts.sort();
        let cut = lasts[lasts.len() / 2];
        map.retain(|_, v| last(v) > cut);
    }
}

#[derive(Debug, Default)]
pub struct Throttle {
    tables: Mutex<Tables>,
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a failure of `source` presenting `token` (`None`: no usable token) at `now`;
    /// answers how long to wait before refusing it.
    pub fn fail(&self, source: Source, token: Option<&str>, now: Instant) -> Duration {
        let mut t = self.lock();
        let mut keys = vec![Key::Source(source)];
        keys.extend(token.map(prefix_key));
        if let Some((tenant, _)) = t.tenants.get(&source) {
            keys.push(Key::Tenant(tenant.clone()));
        }
        let mut worst = 0;
        for key in keys {
            if !t.failures.contains_key(&key) {
                bound(&mut t.failures, now, |(_, l)| *l);
            }
            let e = t.failures.entry(key).or_insert((0, now));
            if now.duration_since(e.1) >= FORGET_AFTER {
                e.0 = 0;
            }
            e.0 = e.0.saturating_add(1);
            e.1 = now;
            worst = worst.max(e.0);
        }
        delay_for(worst)
    }

    /// `source` authenticated as `tenant` (`None`: no tenant): its later failures count
    /// against that tenant too. Forgives nothing.
    pub fn succeed(&self, source: Source, tenant: Option<&str>, now: Instant) {
        let Some(tenant) = tenant else {
            return;
        };
        let mut t = self.lock();
        if t.tenants.get(&source).is_some_and(|(n, _)| n == tenant) {
            if let Some(e) = t.tenants.get_mut(&source) {
                e.1 = now;
            }
            return;
        }
        if !t.tenants.contains_key(&source) {
            bound(&mut t.tenants, now, |(_, l)| *l);
        }
        t.tenants.insert(source, (tenant.to_string(), now));
    }

    /// Failures remembered for `source`.
    pub fn failures(&self, source: Source) -> u32 {
        self.count(&Key::Source(source))
    }

    /// Failures remembered for tokens starting like `token`.
    pub fn prefix_failures(&self, token: &str) -> u32 {
        self.count(&prefix_key(token))
    }

    /// Failures remembered for `tenant`.
    pub fn tenant_failures(&self, tenant: &str) -> u32 {
        self.count(&Key::Tenant(tenant.to_string()))
    }

    fn count(&self, key: &Key) -> u32 {
        self.lock().failures.get(key).map(|(n, _)| *n).unwrap_or(0)
    }

    /// Whether a refusal at `now` may be logged: `Some(n)` with the refusals not logged since
    /// the last line, at most once per [`LOG_EVERY`]; `None` otherwise.
    pub fn log_refusal(&self, now: Instant) -> Option<u64> {
        let mut t = self.lock();
        match &mut t.log {
            Some((at, quiet)) if now.duration_since(*at) < LOG_EVERY => {
                *quiet += 1;
                None
            }
            Some((at, quiet)) => {
                let n = *quiet;
                *at = now;
                *quiet = 0;
                Some(n)
            }
            None => {
                t.log = Some((now, 0));
                Some(0)
            }
        }
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
    fn sources_are_counted_apart_and_a_success_forgives_nothing() {
        let t = Throttle::default();
        let a = Source::Ip("192.0.2.1".parse().unwrap());
        let b = Source::Ip("192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        for i in 0..FREE_FAILURES {
            assert_eq!(t.fail(a, Some(&format!("a{i}-guess")), t0), Duration::ZERO);
        }
        assert_eq!(t.fail(a, Some("a9-guess"), t0), BASE_DELAY);
        assert_eq!(
            t.fail(b, Some("b-other"), t0),
            Duration::ZERO,
            "another source and prefix is not slowed"
        );
        // A success forgives nothing.
        t.succeed(a, Some("alpha"), t0);
        assert_eq!(t.failures(a), FREE_FAILURES + 1);
        assert_eq!(t.fail(a, Some("a8-guess"), t0), BASE_DELAY * 2);
        // Quiet for long enough: a fresh start.
        assert_eq!(
            t.fail(a, Some("a7-guess"), t0 + FORGET_AFTER),
            Duration::ZERO
        );
        assert_eq!(t.failures(a), 1);
    }

    #[test]
    fn one_token_family_is_slowed_from_every_address() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let mut last = Duration::ZERO;
        for i in 0..FREE_FAILURES + 2 {
            let src = Source::Ip(std::net::IpAddr::from([192, 0, 2, 10 + i as u8]));
            last = t.fail(src, Some(&format!("wt-alpha-{i:04}")), t0);
        }
        assert_eq!(t.prefix_failures("wt-alpha-zzzz"), FREE_FAILURES + 2);
        assert_eq!(last, BASE_DELAY * 2);
    }

    #[test]
    fn a_tenants_guesses_count_together_over_addresses() {
        let t = Throttle::default();
        let t0 = Instant::now();
        let mut last = Duration::ZERO;
        for i in 0..FREE_FAILURES + 1 {
            let src = Source::Ip(std::net::IpAddr::from([198, 51, 100, i as u8]));
            // Each address holds tenant beta's good token, then guesses others'.
            t.succeed(src, Some("beta"), t0);
            last = t.fail(src, Some(&format!("{i}-unrelated")), t0);
        }
        assert_eq!(t.tenant_failures("beta"), FREE_FAILURES + 1);
        assert_eq!(last, BASE_DELAY);
    }

    #[test]
    fn refusals_are_logged_at_most_once_per_period() {
        let t = Throttle::default();
        let t0 = Instant::now();
        assert_eq!(t.log_refusal(t0), Some(0));
        for _ in 0..5 {
            assert_eq!(t.log_refusal(t0 + Duration::from_secs(1)), None);
        }
        assert_eq!(t.log_refusal(t0 + LOG_EVERY), Some(5));
    }

    #[test]
    fn the_tables_stay_bounded() {
        let t = Throttle::default();
        let t0 = Instant::now();
        for i in 0..(MAX_KEYS as u32 + 10) {
            let now = t0 + Duration::from_millis(i as u64);
            t.fail(Source::Uid(i), None, now);
            t.succeed(Source::Uid(i), Some("t"), now);
        }
        assert!(t.lock().failures.len() <= MAX_KEYS);
        assert!(t.lock().tenants.len() <= MAX_KEYS);
        // The newest source is remembered.
        assert!(t.failures(Source::Uid(MAX_KEYS as u32 + 9)) >= 1);
    }
}
