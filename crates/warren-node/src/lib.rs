//! A Warren node: the sandbox manager and its HTTP API.
//!
//! - [`manager`] owns every sandbox of the node: create/delete, exec, files and terminals as
//!   typed calls, the TTL/idle reaper, lost-agent detection and restart recovery;
//! - [`store`] keeps the durable state (a `redb` file) the manager recovers from;
//! - [`trajectory`] logs every call that changes a sandbox, durably, and answers retried
//!   steps from the log;
//! - [`api`] is the HTTP edge: it parses requests into manager calls and never decides
//!   anything itself;
//! - [`admission`] is the node's final word on whether a new sandbox may start now, and the
//!   load summary cluster placement reads;
//! - [`metrics`] counts what happens and renders `/metrics`.
//!
//! Substrates are reached only through [`warren_runtime::Runtime`]; this crate never does
//! namespace, cgroup or mount work itself, and never starts or waits for processes.

pub mod admission;
pub mod api;
pub mod config;
pub mod error;
pub mod functions;
pub mod manager;
pub mod metrics;
pub mod store;
#[cfg(test)]
mod testing;
pub mod trajectory;

pub use api::{router, ROUTES};
pub use config::NodeConfig;
pub use error::NodeError;
pub use manager::{Created, ListFilter, Manager, RecoveryReport};
pub use store::Store;
