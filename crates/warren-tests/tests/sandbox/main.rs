//! Real sandboxes through a real daemon: isolation, resource limits, the exec API and the
//! file API. Each test starts its own `warrend`; see `common` for the skip rule.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod disk;
mod exec;
mod files;
mod ids;
mod isolation;
mod limits;
mod mounts;
mod oom;
mod ports;
mod snapshots;
mod stats;
