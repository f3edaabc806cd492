//! An async, typed client for the warrend HTTP API.
//!
//! The daemon listens on a Unix socket (default `/run/warren/warren.sock`) and optionally on
//! TCP (plain on loopback, or TLS); a [`Client`] reaches any of them through a URL:
//! `unix:///path/to.sock`, `http://host:port` or `https://host:port` (default: the
//! `WARREN_URL` environment variable, else [`DEFAULT_URL`]). A token (`WARREN_TOKEN`, or
//! [`ClientBuilder::token`]) is sent as `Authorization: Bearer`; `https` trusts the CAs of
//! `WARREN_CA` (or [`ClientBuilder::ca_file`]), else the system's.
//!
//! One client keeps a pool of keep-alive HTTP/1 connections and bounds how many are open at
//! once, so thousands of concurrent calls from one process queue for a connection instead of
//! exhausting file descriptors. Clones share the pool.
//!
//! ```no_run
//! # async fn demo() -> Result<(), warren_client::ClientError> {
//! use warren_client::{Client, CreateSandboxRequest, ExecRequest};
//!
//! let client = Client::from_env()?;
//! let sandbox = client.create(&CreateSandboxRequest::default()).await?;
//! let result = client.exec(&sandbox.id, &ExecRequest::shell("echo hi")).await?;
//! assert_eq!(result.stdout, "hi\n");
//! client.delete(&sandbox.id).await?;
//! # Ok(()) }
//! ```
//!
//! This crate owns the HTTP contract of `docs/api-routes.md` from the caller's side. It never
//! validates requests beyond what is needed to build a URL: the daemon is the judge, and its
//! answers come back as [`ClientError::Api`] with a stable [`ErrorCode`].

mod client;
mod cluster;
mod dirs;
mod error;
mod exec;
mod failover;
mod files;
mod functions;
mod images;
mod network;
mod ports;
mod pty;
mod sandboxes;
mod stream;
mod tls;
mod trajectory;
mod transport;

pub use client::{Client, ClientBuilder, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_RETRIES, TOKEN_ENV};
pub use dirs::{pack_dir, unpack_into};
pub use error::{BoxError, ClientError};
pub use images::BuildStream;
pub use ports::{PortAnswer, PORT_HEADER};
pub use pty::{resize_frame, PtyEvent, PtyReader, PtySession, PtyWriter};
pub use sandboxes::Health;
pub use stream::{ByteStream, ExecStream, MAX_EVENT_LINE};
pub use tls::{client_config, CA_ENV};
pub use transport::{Endpoint, RawStream, DEFAULT_URL, URL_ENV};

pub use warren_types::{
    ApiError, BuildEvent, BuildOptions, CallFile, CallFileResult, CallRequest, CallResult,
    ChmodRequest, CpuClass, CreateSandboxRequest, CreateSnapshotRequest, ErrorBody, ErrorCode,
    ExecEvent, ExecRequest, ExecResult, FileKind, FileStat, ForkRequest, GcReport, ImageConfig,
    ImageDeleted, ImageImported, ImageInfo, ImageRef, LayerInfo, Limits, MkdirRequest,
    OutputEncoding, PauseStats, PoolStats, PoolsInfo, ProcessInfo, ProcessState, PullRequest,
    ReviveReport, SandboxInfo, SandboxState, SandboxStats, SnapshotInfo, Substrate, TrajectoryCall,
    TrajectoryEntry,
};
