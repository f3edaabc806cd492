//! The agent protocol: how a node daemon talks to the `warren-agent` inside a sandbox.
//!
//! One protocol, several transports: an inherited socketpair for containers, a virtio-serial
//! port or vsock for VMs. Everything is multiplexed over one byte stream as frames:
//!
//! ```text
//! u32 BE  length of the rest (stream id + kind + payload), at most MAX_FRAME
//! u32 BE  stream id (chosen by the daemon when it opens a stream with a CALL)
//! u8      kind (see [`Kind`])
//! ...     payload: JSON for CALL/EVENT/CONTROL, raw bytes for data kinds, BE u32 for CREDIT
//! ```
//!
//! A stream starts with a CALL (daemon → agent) and ends with a final EVENT (agent → daemon;
//! see [`Event::is_final`]). Output flows agent → daemon as STDOUT/STDERR frames, limited by a
//! per-stream credit window the daemon tops up as its consumer drains, so a `yes` flood blocks
//! in its pipe instead of filling the daemon's memory. Input flows daemon → agent as STDIN
//! frames, ended by EOF.
//!
//! This crate never touches sockets itself: [`codec`] reads and writes frames on any
//! `AsyncRead`/`AsyncWrite` (or blocking `Read`/`Write` for the agent's start-up).

pub mod codec;
pub mod msg;

pub use codec::{Frame, FrameError, Kind, MAX_FRAME, MAX_MESSAGE, MAX_PAYLOAD};
pub use msg::{
    Call, ContainerInit, Control, Event, ExecSpec, FunctionInit, GuestNet, HeldStep, Hold, Init,
    InitReply, InvokeFile, InvokeSpec, ProcEntry, UserLimit, UserLimitError,
};

/// The fd on which the daemon passes the control socket to a container's agent.
pub const CONTROL_FD: i32 = 3;
/// The fd where an agent that lost its daemon parks the daemon's end of a fresh socketpair,
/// for a restarted daemon to take with `pidfd_getfd`.
pub const RECONNECT_FD: i32 = 100;

/// The fd where a container's agent keeps an `O_PATH` handle on its writable layer's upper
/// directory, for the daemon to take with `pidfd_getfd` (fork, snapshots).
pub const UPPER_FD: i32 = 101;

/// Bumped on any incompatible change; the agent refuses a daemon with another major version.
pub const PROTOCOL_VERSION: u32 = 1;
