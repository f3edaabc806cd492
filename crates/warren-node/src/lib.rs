//! A Warren node: its parts and their HTTP API.
//!
//! - [`node`] puts the parts side by side, each with one owner: the sandboxes ([`Manager`]),
//!   the images ([`Images`]) and the function pools ([`Functions`]);
//! - [`manager`] owns every sandbox of the node: create/delete, exec, files and terminals as
//!   typed calls, the TTL/idle reaper, lost-agent detection and restart recovery;
//! - [`images`] serves the node's layer store: list, inspect, delete, gc;
//! - [`functions`] keeps warm pools of function containers for one-shot calls;
//! - [`store`] keeps the durable state (a `redb` file) the manager recovers from;
//! - [`trajectory`] logs every call that changes a sandbox, durably, and answers retried
//!   steps from the log;
//! - [`api`] is the HTTP edge: it parses requests into calls on the node's parts and never
//!   decides anything itself;
//! - [`admission`] is the node's final word on whether a new sandbox may start now, and the
//!   load summary cluster placement reads;
//! - [`metrics`] counts what happens and renders `/metrics`.
//!
//! Substrates are reached only through [`warren_runtime::Runtime`]; this crate never does
//! namespace, cgroup or mount work itself, and never starts or waits for processes.

pub mod admission;
pub mod api;
pub mod builds;
pub mod clock;
pub mod config;
pub mod error;
pub mod functions;
pub mod images;
pub mod manager;
pub mod metrics;
pub mod node;
pub mod pressure;
mod quota;
pub mod ship;
pub mod store;
/// Test doubles (the fake runtime and agent): this crate's unit tests, and other crates'
/// tests through the `testing` feature (`warren-testkit`).
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trajectory;

pub use api::{router, ROUTES};
pub use config::NodeConfig;
pub use error::{JournalError, NodeError, StoreError};
pub use functions::Functions;
pub use images::Images;
pub use manager::{Created, ListFilter, Manager, RecoveryReport};
pub use node::Node;
pub use store::Store;
