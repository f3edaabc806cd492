//! The manager's errors. Each maps to one stable API code; the HTTP edge turns them into
//! `{"error":{"code":..,"message":..}}` without looking inside.

use warren_runtime::RuntimeError;
use warren_types::{ApiError, ErrorCode, SandboxId, SandboxState, Substrate};

use std::path::PathBuf;

/// Why the state file (sandboxes, keys, trajectories) failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} ({path}): {source}")]
    Db {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<redb::Error>,
    },
    #[error("cannot create directory {path}: {source}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encode {what}: {source}")]
    Encode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A trajectory append was not committed.
    #[error("trajectory ({path}): {cause}")]
    Append {
        path: PathBuf,
        #[source]
        cause: AppendFailure,
    },
    /// A log file of the trajectory journal failed.
    #[error("{what} ({path}): {source}")]
    Journal {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<JournalError>,
    },
    /// An output blob file could not be written, read or listed.
    #[error("trajectory blob {what} ({path}): {source}")]
    Blob {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The trajectory store answered an error, or holds a log that cannot be read back as
    /// asked; carries the API code.
    #[error("trajectory store: {message}")]
    Shipped {
        code: warren_types::ErrorCode,
        message: String,
    },
}

/// Why a write or a scan of the trajectory journal failed: its index (the redb tables of
/// log lengths, steps and output references) or one of its files (a log, an output blob).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The index failed.
    #[error("index: {0}")]
    Index(#[from] redb::Error),
    /// A log file could not be created, written or synced.
    #[error("log file ({what}): {source}")]
    Log {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A log could not be read back, or an output blob written (the error names the file).
    #[error("{0}")]
    File(#[source] Box<StoreError>),
}

/// redb's own error types, each an index failure.
macro_rules! index_errors {
    ($($t:ty),*) => {
        $(impl From<$t> for JournalError {
            fn from(e: $t) -> Self {
                JournalError::Index(e.into())
            }
        })*
    };
}
index_errors!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

impl From<StoreError> for JournalError {
    fn from(e: StoreError) -> Self {
        JournalError::File(Box::new(e))
    }
}

impl JournalError {
    /// A stable name of the failure (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            JournalError::Index(_) => "index",
            JournalError::Log { .. } => "log",
            JournalError::File(_) => "file",
        }
    }

    /// As an error of the state file at `path` while doing `what`: an index failure is a
    /// `Db` error, a file's keeps its own path.
    pub fn into_store(self, what: &'static str, path: &std::path::Path) -> StoreError {
        match self {
            JournalError::Index(e) => StoreError::Db {
                what,
                path: path.to_path_buf(),
                source: Box::new(e),
            },
            JournalError::File(e) => *e,
            e @ JournalError::Log { .. } => StoreError::Journal {
                what,
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }
}

/// Why a trajectory append was not committed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendFailure {
    /// Its group's write failed (every append of the group shares the cause).
    #[error("append: {0}")]
    Commit(std::sync::Arc<JournalError>),
    /// The journal's writer is gone (the node is stopping).
    #[error("the trajectory writer stopped")]
    Stopped,
}

impl StoreError {
    /// The stable API code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Shipped { code, .. } => *code,
            _ => ErrorCode::Internal,
        }
    }
}

/// Why a manager call failed.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The request was refused by validation; carries the code (`invalid_request`,
    /// `invalid_path`) and the message that tells the caller what to fix.
    #[error("{0}")]
    Invalid(ApiError),
    #[error("sandbox {id} not found{}", .why.as_deref().map(|w| format!(" (deleted: {w})")).unwrap_or_default())]
    SandboxNotFound { id: SandboxId, why: Option<String> },
    #[error("sandbox {id} is {}{}", .state.as_str(), .reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default())]
    NotRunning {
        id: SandboxId,
        state: SandboxState,
        reason: Option<String>,
    },
    #[error("substrate {} is not served by this node (it serves: {served})", .requested.as_str())]
    UnsupportedSubstrate {
        requested: Substrate,
        served: String,
    },
    #[error("this node holds {max} sandboxes already (its limit)")]
    TooManySandboxes { max: usize },
    #[error("idempotency key {key:?} was used by a different request (sandbox {id})")]
    IdempotencyConflict { key: String, id: SandboxId },
    #[error("sandbox {id}: step {step} cannot run: {why}")]
    StepConflict {
        id: SandboxId,
        step: u64,
        why: String,
    },
    #[error("sandbox {id}: {source}")]
    Runtime {
        id: SandboxId,
        #[source]
        source: RuntimeError,
    },
    /// The runtime could not start the sandbox; nothing of it was kept.
    #[error("cannot create the sandbox: {source}")]
    CreateFailed {
        #[source]
        source: RuntimeError,
    },
    /// Boxed: redb's errors are large and this one is rare.
    #[error("state store: {0}")]
    Store(Box<StoreError>),
    /// An API error as it was recorded (a replayed step that failed) or reported.
    #[error("{0}")]
    Api(ApiError),
    /// The sandbox's network could not be set up as asked.
    #[error("{0}")]
    Network(#[from] warren_net::NetError),
}

impl NodeError {
    pub(crate) fn runtime(id: &SandboxId, source: RuntimeError) -> Self {
        NodeError::Runtime {
            id: id.clone(),
            source,
        }
    }

    /// The stable API code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            NodeError::Invalid(e) | NodeError::Api(e) => e.code,
            NodeError::SandboxNotFound { .. } => ErrorCode::NotFound,
            NodeError::NotRunning {
                state: SandboxState::Failed,
                ..
            } => ErrorCode::SandboxLost,
            NodeError::NotRunning { .. } => ErrorCode::InvalidState,
            NodeError::UnsupportedSubstrate { .. } => ErrorCode::UnsupportedSubstrate,
            NodeError::TooManySandboxes { .. } => ErrorCode::LimitExceeded,
            NodeError::IdempotencyConflict { .. } => ErrorCode::Conflict,
            NodeError::StepConflict { .. } => ErrorCode::StepConflict,
            NodeError::Runtime { source, .. } | NodeError::CreateFailed { source } => source.code(),
            NodeError::Store(e) => e.code(),
            NodeError::Network(e) => match e {
                warren_net::NetError::Policy(_) => ErrorCode::InvalidRequest,
                warren_net::NetError::PoolExhausted { .. } => ErrorCode::LimitExceeded,
                _ => ErrorCode::Internal,
            },
        }
    }

    /// The error as the API shows it.
    pub fn to_api(&self) -> ApiError {
        match self {
            NodeError::Invalid(e) | NodeError::Api(e) => e.clone(),
            // The agent's own messages (file errors, timeouts) are already worded for the caller.
            NodeError::Runtime {
                source: RuntimeError::Agent { code, message },
                ..
            } => ApiError::new(*code, message.clone()),
            NodeError::TooManySandboxes { .. } => {
                let mut e = ApiError::new(self.code(), self.to_string());
                e.retry_after = Some(5);
                e
            }
            other => ApiError::new(other.code(), other.to_string()),
        }
    }
}

impl From<StoreError> for NodeError {
    fn from(e: StoreError) -> Self {
        NodeError::Store(Box::new(e))
    }
}

impl From<ApiError> for NodeError {
    fn from(e: ApiError) -> Self {
        NodeError::Invalid(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_cause() {
        let id: SandboxId = "n1-01jd0m7x4e8k0k9yq1w2e3r4t5".parse().unwrap();
        let e = NodeError::SandboxNotFound {
            id: id.clone(),
            why: Some("ttl expired".into()),
        };
        assert_eq!(e.code(), ErrorCode::NotFound);
        assert!(e.to_string().contains("ttl expired"));
        let e = NodeError::NotRunning {
            id: id.clone(),
            state: SandboxState::Failed,
            reason: None,
        };
        assert_eq!(e.code(), ErrorCode::SandboxLost);
        let e = NodeError::runtime(
            &id,
            RuntimeError::Agent {
                code: ErrorCode::FileError,
                message: "nope".into(),
            },
        );
        assert_eq!(e.to_api(), ApiError::new(ErrorCode::FileError, "nope"));
        assert_eq!(
            NodeError::TooManySandboxes { max: 1 }.to_api().retry_after,
            Some(5)
        );
    }
}
