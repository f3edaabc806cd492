//! Tenant quotas (used by the sandbox manager and the function calls): live sandboxes, memory and CPUs reserved, creations per second (a token
//! bucket) and concurrent function calls. The limits come with each call's [`Caller`] (so a
//! reloaded auth file applies to the next call); the usage lives here, per tenant.
//!
//! Sandbox usage is counted in the same critical section that inserts the sandbox into the
//! manager's map (and released when it leaves the map), so the quota holds exactly however
//! many creates race: a create reserves before anything is started and gives the
//! reservation back when it fails.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_types::{Caller, Limits, Quota};

use crate::error::NodeError;

/// Usage of one tenant.
#[derive(Debug, Default)]
struct Usage {
    sandboxes: u64,
    memory_mb: u64,
    /// Thousandths of a CPU, so sums stay exact.
    cpus_milli: u64,
    calls: u64,
    bucket: Option<Bucket>,
}

/// A token bucket: `rate` tokens a second, at most `burst`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(crate) fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
    }

    /// Takes one token, or answers how long until one is there.
    pub(crate) fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        self.refill(rate, burst, now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

fn milli(cpus: f64) -> u64 {
    (cpus * 1000.0).round().max(0.0) as u64
}

/// Usage of every tenant of the node.
#[derive(Debug, Default)]
pub(crate) struct Tenants {
    usage: Mutex<HashMap<String, Usage>>,
}

impl Tenants {
    /// Takes a creation token of the caller's bucket (for `n` sandboxes: `n` tokens, all or
    /// none).
    pub(crate) fn rate(&self, caller: &Caller, n: u32, now: Instant) -> Result<(), NodeError> {
        let (Some(tenant), Some(rate)) = (&caller.tenant, caller.quotas.creates_per_second) else {
            return Ok(());
        };
        let burst = caller
            .quotas
            .create_burst
            .map(f64::from)
            .unwrap_or(rate.ceil().max(1.0));
        let mut map = self.usage.lock().expect("quota lock");
        let u = map.entry(tenant.clone()).or_default();
        let bucket = u.bucket.get_or_insert_with(|| Bucket::full(burst, now));
        let mut trial = *bucket;
        for _ in 0..n {
            if let Err(wait) = trial.take(rate, burst, now) {
                // Nothing taken: the caller may retry the whole request later.
                bucket.refill(rate, burst, now);
                return Err(NodeError::Api(Quota::CreatesPerSecond.exceeded(
                    tenant,
                    format!("at most {rate} creations a second (burst {burst})"),
                    wait.as_secs_f64().ceil() as u64,
                )));
            }
        }
        *bucket = trial;
        Ok(())
    }

    /// Counts `n` sandboxes of `limits` for `owner`, checking `caller`'s quotas first when
    /// the caller is that tenant. Call with the sandbox map locked, then insert.
    pub(crate) fn admit(
        &self,
        caller: &Caller,
        owner: Option<&str>,
        n: u64,
        limits: &Limits,
    ) -> Result<(), NodeError> {
        let Some(owner) = owner else {
            return Ok(());
        };
        let mut map = self.usage.lock().expect("quota lock");
        let u = map.entry(owner.to_string()).or_default();
        let (mem, cpu) = (limits.memory_mb * n, milli(limits.cpus) * n);
        if caller.tenant.as_deref() == Some(owner) {
            let q = &caller.quotas;
            if let Some(max) = q.max_sandboxes {
                if u.sandboxes + n > max {
                    return Err(NodeError::Api(Quota::Sandboxes.exceeded(
                        owner,
                        format!("{} live of at most {max}", u.sandboxes),
                        1,
                    )));
                }
            }
            if let Some(max) = q.max_memory_mb {
                if u.memory_mb + mem > max {
                    return Err(NodeError::Api(Quota::MemoryMb.exceeded(
                        owner,
                        format!(
                            "{} MiB reserved, {mem} MiB more asked, at most {max} MiB",
                            u.memory_mb
                        ),
                        1,
                    )));
                }
            }
            if let Some(max) = q.max_cpus {
                if u.cpus_milli + cpu > milli(max) {
                    return Err(NodeError::Api(Quota::Cpus.exceeded(
                        owner,
                        format!(
                            "{} CPUs reserved, {} more asked, at most {max}",
                            u.cpus_milli as f64 / 1000.0,
                            cpu as f64 / 1000.0
                        ),
                        1,
                    )));
                }
            }
        }
        u.sandboxes += n;
        u.memory_mb += mem;
        u.cpus_milli += cpu;
        Ok(())
    }

    /// Gives back one sandbox of `limits` (it left the node).
    pub(crate) fn release(&self, owner: Option<&str>, limits: &Limits) {
        let Some(owner) = owner else {
            return;
        };
        let mut map = self.usage.lock().expect("quota lock");
        if let Some(u) = map.get_mut(owner) {
            u.sandboxes = u.sandboxes.saturating_sub(1);
            u.memory_mb = u.memory_mb.saturating_sub(limits.memory_mb);
            u.cpus_milli = u.cpus_milli.saturating_sub(milli(limits.cpus));
        }
    }

    /// Holds one function-call slot of the caller's tenant until the guard is dropped.
    pub(crate) fn call_slot(self: &Arc<Self>, caller: &Caller) -> Result<CallSlot, NodeError> {
        let Some(tenant) = &caller.tenant else {
            return Ok(CallSlot(None));
        };
        let mut map = self.usage.lock().expect("quota lock");
        let u = map.entry(tenant.clone()).or_default();
        if let Some(max) = caller.quotas.max_concurrent_calls {
            if u.calls >= max {
                return Err(NodeError::Api(Quota::ConcurrentCalls.exceeded(
                    tenant,
                    format!("{} calls in flight of at most {max}", u.calls),
                    1,
                )));
            }
        }
        u.calls += 1;
        Ok(CallSlot(Some((self.clone(), tenant.clone()))))
    }

    /// (sandboxes, memory MiB, CPUs, calls) counted for `tenant` (tests).
    #[cfg(test)]
    pub(crate) fn usage(&self, tenant: &str) -> (u64, u64, f64, u64) {
        let map = self.usage.lock().expect("quota lock");
        map.get(tenant)
            .map(|u| {
                (
                    u.sandboxes,
                    u.memory_mb,
                    u.cpus_milli as f64 / 1000.0,
                    u.calls,
                )
            })
            .unwrap_or_default()
    }
}

/// A function call counted against its tenant's `max_concurrent_calls`.
pub(crate) struct CallSlot(Option<(Arc<Tenants>, String)>);

impl Drop for CallSlot {
    fn drop(&mut self) {
        if let Some((t, tenant)) = self.0.take() {
            let mut map = t.usage.lock().expect("quota lock");
            if let Some(u) = map.get_mut(&tenant) {
                u.calls = u.calls.saturating_sub(1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_types::{ErrorCode, Quotas, Role};

    fn user(q: Quotas) -> Caller {
        Caller::tenant("a", Role::User, q)
    }

    fn refusal(r: Result<(), NodeError>) -> Option<(ErrorCode, String)> {
        r.err().map(|e| {
            let a = e.to_api();
            (a.code, a.message)
        })
    }

    #[test]
    fn bucket_refills_at_its_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::full(2.0, t0);
        assert!(b.take(1.0, 2.0, t0).is_ok());
        assert!(b.take(1.0, 2.0, t0).is_ok());
        let wait = b.take(1.0, 2.0, t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(1));
        assert!(b.take(1.0, 2.0, t0 + Duration::from_millis(500)).is_err());
        assert!(b.take(1.0, 2.0, t0 + Duration::from_millis(1000)).is_ok());
        // Never more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(3600);
        assert!(b.take(1.0, 2.0, later).is_ok());
        assert!(b.take(1.0, 2.0, later).is_ok());
        assert!(b.take(1.0, 2.0, later).is_err());
    }

    #[test]
    fn the_rate_quota_names_itself_and_says_when() {
        let t = Tenants::default();
        let c = user(Quotas {
            creates_per_second: Some(2.0),
            ..Default::default()
        });
        let now = Instant::now();
        t.rate(&c, 1, now).unwrap();
        t.rate(&c, 1, now).unwrap();
        let (code, msg) = refusal(t.rate(&c, 1, now)).unwrap();
        assert_eq!(code, ErrorCode::QuotaExceeded);
        assert!(msg.contains("creates_per_second"), "{msg}");
        // All or nothing for a fork of 3: the 1 token that refilled is kept.
        let later = now + Duration::from_millis(500);
        assert!(t.rate(&c, 3, later).is_err());
        t.rate(&c, 1, later).unwrap();
        // Admins and tenants without the quota are not limited.
        for _ in 0..100 {
            t.rate(&Caller::admin(), 1, now).unwrap();
            t.rate(&user(Quotas::default()), 1, now).unwrap();
        }
    }

    #[test]
    fn sandbox_memory_and_cpu_quotas_hold_and_release() {
        let t = Tenants::default();
        let c = user(Quotas {
            max_sandboxes: Some(3),
            max_memory_mb: Some(1000),
            max_cpus: Some(2.5),
            ..Default::default()
        });
        let small = Limits {
            memory_mb: 300,
            cpus: 0.5,
            ..Default::default()
        };
        t.admit(&c, Some("a"), 3, &small).unwrap();
        let (code, msg) = refusal(t.admit(&c, Some("a"), 1, &small)).unwrap();
        assert_eq!(code, ErrorCode::QuotaExceeded);
        assert!(msg.contains("max_sandboxes"), "{msg}");
        t.release(Some("a"), &small);
        assert_eq!(t.usage("a"), (2, 600, 1.0, 0));
        let big = Limits {
            memory_mb: 500,
            cpus: 0.5,
            ..Default::default()
        };
        let (_, msg) = refusal(t.admit(&c, Some("a"), 1, &big)).unwrap();
        assert!(msg.contains("max_memory_mb"), "{msg}");
        let hungry = Limits {
            memory_mb: 100,
            cpus: 1.6,
            ..Default::default()
        };
        let (_, msg) = refusal(t.admit(&c, Some("a"), 1, &hungry)).unwrap();
        assert!(msg.contains("max_cpus"), "{msg}");
        assert_eq!(t.usage("a"), (2, 600, 1.0, 0), "refusals count nothing");
        // An admin acting on tenant a's behalf (a fork) is counted, not refused.
        t.admit(&Caller::admin(), Some("a"), 5, &small).unwrap();
        assert_eq!(t.usage("a").0, 7);
        // Sandboxes of no tenant are not counted.
        t.admit(&Caller::admin(), None, 5, &small).unwrap();
        t.release(None, &small);
    }

    #[test]
    fn call_slots_are_given_back() {
        let t = Arc::new(Tenants::default());
        let c = user(Quotas {
            max_concurrent_calls: Some(2),
            ..Default::default()
        });
        let a = t.call_slot(&c).unwrap();
        let _b = t.call_slot(&c).unwrap();
        let e = t.call_slot(&c).err().unwrap().to_api();
        assert!(e.message.contains("max_concurrent_calls"), "{}", e.message);
        assert_eq!(e.retry_after, Some(1));
        drop(a);
        let _c = t.call_slot(&c).unwrap();
        assert_eq!(t.usage("a").3, 2);
    }
}
