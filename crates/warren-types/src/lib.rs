//! Warren's public vocabulary: sandbox ids, create/exec/file requests and results, trajectory
//! entries, and the stable error codes of the HTTP API.
//!
//! This crate owns the *shape* of the API and the validation rules that every edge applies
//! (HTTP server, CLI, agent). It never does I/O and never depends on another Warren crate.

pub mod auth;
pub mod cluster;
pub mod error;
pub mod exec;
pub mod files;
pub mod function;
#[cfg(feature = "http")]
pub mod http;
pub mod id;
pub mod image;
pub mod network;
pub mod routes;
pub mod sandbox;
pub mod snapshot;
pub mod stats;
pub mod trajectory;
pub mod units;
pub mod validate;

pub use auth::{Caller, CallerSummary, Quota, Quotas, Role};
pub use cluster::{
    ClusterInfo, NodeCapacity, NodeLoad, NodeRecord, NodeState, NodeSummary, NodeSummaryRecord,
    WarmPool, NODE_RECORD_FORMAT,
};
pub use error::{ApiError, ErrorBody, ErrorCode};
pub use exec::{
    ExecEvent, ExecRequest, ExecResult, ExitInfo, OutputEncoding, ProcessInfo, ProcessState,
    PtyAttachRequest, PtyClientLine, PtyServerLine,
};
pub use files::{ChmodRequest, FileKind, FileStat, MkdirRequest};
pub use function::{CallFile, CallFileResult, CallRequest, CallResult, PoolStats, PoolsInfo};
pub use id::{NodeId, SandboxId};
pub use image::{
    BuildEvent, BuildOptions, GcReport, Healthcheck, ImageConfig, ImageDeleted, ImageImported,
    ImageInfo, LayerInfo, PullRequest,
};
pub use network::{AllowRule, NetworkMode, NetworkPolicy, NetworkStatus, Ports, Protocol};
pub use sandbox::{
    CpuClass, CreateSandboxRequest, DiskMedium, ForkRequest, ForkResult, ImageRef, Limits,
    PauseStats, SandboxInfo, SandboxState, Substrate,
};
pub use snapshot::{CreateSnapshotRequest, SnapshotId, SnapshotInfo, SnapshotList};
pub use stats::SandboxStats;
pub use trajectory::{
    Divergence, ExecCall, ExecOutcome, ReplayOutcome, ReviveOptions, ReviveReport, TerminalChunk,
    TerminalOutcome, TerminalStream, TrajectoryCall, TrajectoryEntry, TrajectoryResult,
};
