//! When a call goes to the next URL, waits, or gives up.
//!
//! A client may be given several URLs (gateways of one cluster, or the same node on two
//! sockets). This module owns the rules, as pure functions of what one attempt produced, so
//! they are tested without a network; `client.rs` runs the attempts. It never opens a
//! connection or sleeps.
//!
//! The rules:
//! - A request that never left (the connection was refused, or timed out while connecting) is
//!   sent to the next URL, whatever the call: nothing can have happened anywhere.
//! - A call that is safe to repeat ([`Retry::Idempotent`]: reads, and creates carrying an
//!   idempotency key) also goes to the next URL after a connection that broke once the request
//!   was sent, and after a `503` (a gateway or node that is unavailable), except
//!   `503 node_unreachable`: every gateway sees the same dead node, so that answer comes back
//!   at once.
//! - Once every URL was tried in a round, or on a `429` that carries a `Retry-After` (the
//!   server is saturated; a `429` without one is a limit that waiting does not lift), a safe
//!   call waits (`Retry-After` when the server sent it, capped at 30 s; else a short
//!   exponential backoff) and starts again. At most [`crate::ClientBuilder::max_retries`]
//!   waits are made.
//! - Everything else is returned to the caller as it came.

use std::time::Duration;

/// How far a call may be repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Only while the request has not been sent: any other failure is the caller's.
    IfUnsent,
    /// Safe to send again: a second delivery changes nothing.
    Idempotent,
}

impl Retry {
    /// `GET` and `HEAD` are safe by themselves; other methods are safe only when the route
    /// says so (a create with an idempotency key).
    pub(crate) fn for_method(method: &hyper::Method) -> Retry {
        if method == hyper::Method::GET || method == hyper::Method::HEAD {
            Retry::Idempotent
        } else {
            Retry::IfUnsent
        }
    }
}

/// What one attempt produced, as far as the retry rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The request never reached the server (connect refused or timed out).
    NotSent,
    /// The connection failed after the request may have been sent.
    Broken,
    /// An error status, with the server's `Retry-After` (header, else the JSON error body)
    /// and its error code when it sent one.
    Status {
        status: u16,
        retry_after: Option<Duration>,
        code: Option<String>,
    },
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Send to the next URL now.
    NextUrl,
    /// Wait, then send to the URL tried first in this call.
    Wait(Duration),
    /// Give the failure to the caller.
    GiveUp,
}

/// The longest wait a `Retry-After` may impose between two attempts.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(30);
/// The first backoff when the server named no wait; doubled per wait.
const BACKOFF_BASE: Duration = Duration::from_millis(50);
/// The longest backoff without a `Retry-After`.
const BACKOFF_CAP: Duration = Duration::from_secs(2);

/// The state of one call's attempts over the client's URLs.
#[derive(Debug)]
pub(crate) struct Plan {
    urls: usize,
    max_waits: u32,
    retry: Retry,
    /// URLs tried since the last wait (the current one included).
    tried_in_round: usize,
    waits: u32,
}

impl Plan {
    pub(crate) fn new(urls: usize, max_waits: u32, retry: Retry) -> Plan {
        Plan {
            urls: urls.max(1),
            max_waits,
            retry,
            tried_in_round: 1,
            waits: 0,
        }
    }

    /// Decides what follows a failed attempt, and counts it.
    pub(crate) fn after(&mut self, attempt: &Attempt) -> Step {
        let untried = self.tried_in_round < self.urls;
        let safe = self.retry == Retry::Idempotent;
        let step = match attempt {
            Attempt::NotSent if untried => Step::NextUrl,
            Attempt::NotSent | Attempt::Broken if safe => {
                if untried {
                    Step::NextUrl
                } else {
                    self.wait(None)
                }
            }
            Attempt::Status {
                status: 503,
                code,
                retry_after,
            } if safe && code.as_deref() != Some("node_unreachable") => {
                if untried {
                    Step::NextUrl
                } else {
                    self.wait(*retry_after)
                }
            }
            Attempt::Status {
                status: 429,
                retry_after: Some(r),
                ..
            } if safe => self.wait(Some(*r)),
            _ => Step::GiveUp,
        };
        match step {
            Step::NextUrl => self.tried_in_round += 1,
            Step::Wait(_) => {
                self.waits += 1;
                self.tried_in_round = 1;
            }
            Step::GiveUp => {}
        }
        step
    }

    fn wait(&self, retry_after: Option<Duration>) -> Step {
        if self.waits >= self.max_waits {
            return Step::GiveUp;
        }
        let backoff = BACKOFF_BASE
            .saturating_mul(1u32 << self.waits.min(16))
            .min(BACKOFF_CAP);
        Step::Wait(
            retry_after
                .map_or(backoff, |r| r.max(backoff))
                .min(MAX_WAIT),
        )
    }
}

/// Reads a `Retry-After` header: delay-seconds only (HTTP dates are not sent by Warren).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, secs: Option<u64>, code: Option<&str>) -> Attempt {
        Attempt::Status {
            status,
            retry_after: secs.map(Duration::from_secs),
            code: code.map(str::to_string),
        }
    }

    #[test]
    fn unsent_requests_visit_every_url_once_whatever_the_call() {
        let mut p = Plan::new(3, 5, Retry::IfUnsent);
        assert_eq!(p.after(&Attempt::NotSent), Step::NextUrl);
        assert_eq!(p.after(&Attempt::NotSent), Step::NextUrl);
        assert_eq!(p.after(&Attempt::NotSent), Step::GiveUp);
    }

    #[test]
    fn unsafe_calls_never_repeat_once_sent() {
        for a in [
            Attempt::Broken,
            status(503, Some(1), None),
            status(429, Some(1), Some("busy")),
            status(500, None, None),
        ] {
            let mut p = Plan::new(3, 5, Retry::IfUnsent);
            assert_eq!(p.after(&a), Step::GiveUp, "{a:?}");
        }
    }

    #[test]
    fn safe_calls_fail_over_then_wait_in_rounds() {
        let mut p = Plan::new(2, 2, Retry::Idempotent);
        assert_eq!(p.after(&status(503, Some(3), None)), Step::NextUrl);
        assert_eq!(
            p.after(&status(503, Some(3), None)),
            Step::Wait(Duration::from_secs(3))
        );
        // A new round: the other URL again, then a wait.
        assert_eq!(p.after(&Attempt::Broken), Step::NextUrl);
        assert!(matches!(p.after(&Attempt::NotSent), Step::Wait(_)));
        // Two waits were the budget.
        assert_eq!(p.after(&Attempt::NotSent), Step::NextUrl);
        assert_eq!(p.after(&Attempt::NotSent), Step::GiveUp);
    }

    #[test]
    fn saturation_waits_on_the_same_url_as_told() {
        let mut p = Plan::new(3, 3, Retry::Idempotent);
        assert_eq!(
            p.after(&status(429, Some(2), Some("busy"))),
            Step::Wait(Duration::from_secs(2))
        );
        // Retry-After is capped; a 0 still backs off a little.
        assert_eq!(
            p.after(&status(429, Some(3600), None)),
            Step::Wait(MAX_WAIT)
        );
        let Step::Wait(d) = p.after(&status(429, Some(0), None)) else {
            panic!("expected a wait")
        };
        assert!(d > Duration::ZERO && d <= BACKOFF_CAP);
        assert_eq!(p.after(&status(429, Some(1), None)), Step::GiveUp);
        // A limit without Retry-After is not waited for.
        let mut p = Plan::new(3, 3, Retry::Idempotent);
        assert_eq!(
            p.after(&status(429, None, Some("limit_exceeded"))),
            Step::GiveUp
        );
    }

    #[test]
    fn a_dead_node_and_client_errors_come_back_at_once() {
        for a in [
            status(503, Some(1), Some("node_unreachable")),
            status(410, None, Some("sandbox_lost")),
            status(404, None, Some("not_found")),
            status(422, None, None),
        ] {
            let mut p = Plan::new(3, 5, Retry::Idempotent);
            assert_eq!(p.after(&a), Step::GiveUp, "{a:?}");
        }
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let mut p = Plan::new(1, 40, Retry::Idempotent);
        let mut last = Duration::ZERO;
        for _ in 0..40 {
            let Step::Wait(d) = p.after(&Attempt::Broken) else {
                panic!("expected a wait")
            };
            assert!(d >= last && d <= BACKOFF_CAP);
            last = d;
        }
        assert_eq!(last, BACKOFF_CAP);
    }

    #[test]
    fn retry_after_header_values() {
        assert_eq!(parse_retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }
}
