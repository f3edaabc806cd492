//! Image builds from Dockerfiles.
//!
//! - [`parse`]: the Dockerfile → instructions (directives, continuations, heredocs, exec form);
//! - [`words`]: `$VAR` substitution and word splitting of arguments;
//! - [`context`]: the build context and `.dockerignore`;
//! - [`stack`]: reading a stack of layers as a sandbox sees it (for `COPY` and `WORKDIR`);
//! - [`copy`]: planning and staging the files a `COPY`/`ADD`/`WORKDIR` adds;
//! - [`add`]: the local archives an `ADD` unpacks;
//! - [`build`]: the planner and step runner (stages, the cache, the image's configuration).
//!
//! This crate owns no sandbox: every `RUN` goes to the node through [`Host::run`], which
//! starts a sandbox of the node's own runtime over the stage's layers, runs the command and
//! captures the sandbox's writable layer as a layer of the store. Layers made here
//! (`COPY`, `WORKDIR`) are directories packed by the image store. The cache is the store's
//! (`ImageStore::cache_get`/`cache_put`); this crate computes its keys.

pub mod add;
pub mod build;
pub mod context;
pub mod copy;
pub mod parse;
pub mod stack;
pub mod words;

use warren_types::ErrorCode;

pub use build::{build, BuildRequest, Built, Host, RunEvent, RunResult, RunSpec};

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The Dockerfile does not parse.
    #[error("Dockerfile line {line}: {message}")]
    Parse { line: usize, message: String },
    /// An instruction or option cannot be carried out as written.
    #[error("{0}")]
    Invalid(String),
    /// A step failed (a `RUN` exited non-zero, timed out or was killed).
    #[error("step {step} ({instruction}) failed: {message}")]
    Step {
        step: usize,
        instruction: String,
        message: String,
        exit_code: Option<i32>,
        output_tail: Vec<String>,
    },
    /// The node could not run a step (sandbox start, capture).
    #[error("{message}")]
    Host { code: ErrorCode, message: String },
    #[error(transparent)]
    Image(#[from] warren_image::ImageError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The client went away.
    #[error("the build was cancelled")]
    Cancelled,
}

impl BuildError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BuildError::Io {
            what: what.into(),
            source,
        }
    }

    /// The stable API code.
    pub fn code(&self) -> ErrorCode {
        match self {
            BuildError::Parse { .. } | BuildError::Invalid(_) => ErrorCode::InvalidRequest,
            BuildError::Step { .. } => ErrorCode::BuildFailed,
            BuildError::Host { code, .. } => *code,
            BuildError::Image(e) => e.code(),
            BuildError::Io { .. } => ErrorCode::Internal,
            BuildError::Cancelled => ErrorCode::InvalidState,
        }
    }

    /// The error as the last line of a build's log.
    pub fn event(&self) -> warren_types::BuildEvent {
        let (step, instruction, exit_code, output_tail) = match self {
            BuildError::Step {
                step,
                instruction,
                exit_code,
                output_tail,
                ..
            } => (
                Some(*step),
                Some(instruction.clone()),
                *exit_code,
                output_tail.clone(),
            ),
            _ => (None, None, None, Vec::new()),
        };
        warren_types::BuildEvent::Error {
            code: self.code(),
            message: self.to_string(),
            step,
            instruction,
            exit_code,
            output_tail,
        }
    }
}
