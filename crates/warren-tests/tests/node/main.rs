//! The node as a whole: daemon restarts with live sandboxes, a kill during a burst of steps
//! (every answered step is in the log after), crashed sandboxes, many concurrent creates,
//! malformed requests, and lifecycle features (idempotency keys, TTL, labels). Each test starts its own `warrend`; see `common` for the skip rule.

#[path = "../common/mod.rs"]
mod common;

mod burst;
mod concurrency;
mod crash;
mod exactly_once;
mod export;
mod fence;
mod lifecycle;
mod logs;
mod malformed;
mod metrics;
mod one_answer;
mod pools;
mod restart;
mod resume;
mod revive;
mod store_mounts;
