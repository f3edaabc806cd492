//! Substrates behind one trait.
//!
//! A [`Runtime`] creates, re-adopts and destroys sandboxes of one substrate (container,
//! microvm, vm, function). Every sandbox it makes is an [`Instance`] whose in-sandbox agent is
//! reached through an [`AgentConn`] — the same protocol for every substrate, so exec, files
//! and terminals are written once, above this crate. Runtimes never depend on each other and
//! never see HTTP.

pub mod agent;
pub mod cgroup;
pub mod container;
pub mod error;

use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::Arc;
use warren_types::{Limits, SandboxId, Substrate};

pub use agent::{
    AgentConn, ExecOutput, ExecStream, ExitInfo, FileReader, FileWriter, PtySession, StreamItem,
};
pub use error::RuntimeError;

/// Everything a runtime needs to build a sandbox (already validated by the API edge).
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: SandboxId,
    /// Image refs, lowest layer first.
    pub image: Vec<String>,
    pub limits: Limits,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
}

/// One substrate.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    fn substrate(&self) -> Substrate;

    /// Creates and starts a sandbox. On error nothing of it is left on the host.
    async fn create(&self, spec: &SandboxSpec) -> Result<Arc<dyn Instance>, RuntimeError>;

    /// Re-attaches to a sandbox made by an earlier daemon process, from what
    /// [`Instance::record`] returned then.
    async fn adopt(
        &self,
        spec: &SandboxSpec,
        record: &serde_json::Value,
    ) -> Result<Arc<dyn Instance>, RuntimeError>;

    /// Tears down whatever is left of a sandbox that cannot be adopted. Idempotent.
    async fn destroy_record(
        &self,
        id: &SandboxId,
        record: Option<&serde_json::Value>,
    ) -> Result<(), RuntimeError>;

    /// Removes host objects (cgroups, processes, ...) that belong to this runtime but to no
    /// sandbox in `known`. Returns a description of what was removed.
    async fn reconcile(&self, known: &[SandboxId]) -> Result<Vec<String>, RuntimeError>;
}

/// A live sandbox.
#[async_trait]
pub trait Instance: Send + Sync + 'static {
    fn id(&self) -> &SandboxId;

    /// What must be persisted to re-adopt this sandbox after a daemon restart.
    fn record(&self) -> serde_json::Value;

    /// The in-sandbox agent.
    fn agent(&self) -> &AgentConn;

    /// Kills everything in the sandbox and releases its host resources. Idempotent.
    async fn destroy(&self) -> Result<(), RuntimeError>;

    /// Resolves when the sandbox dies on its own (its agent exited or was killed).
    async fn lost(&self);

    /// Current resource use (best effort).
    fn usage(&self) -> Usage {
        Usage::default()
    }
}

/// Resource use of one sandbox.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Usage {
    pub memory_bytes: Option<u64>,
    pub cpu_usec: Option<u64>,
    pub pids: Option<u64>,
}
