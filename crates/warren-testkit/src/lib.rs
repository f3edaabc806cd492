//! Test helpers shared by several crates (dev-dependency only; never in a binary).
//!
//! - [`routes`] checks behaviour that every API server of Warren (a node's, a gateway's) must
//!   give alike, so one copy of the check holds them all to it. It depends on no server
//!   crate: a server hands it its router and its route table.
//! - [`daemon`] (feature `node`) is the one fake daemon of the client's and the CLI's tests:
//!   the node's real router over the node's fake runtime, on a Unix socket.

#[cfg(feature = "node")]
pub mod daemon;
pub mod routes;

#[cfg(feature = "node")]
pub use daemon::FakeDaemon;
