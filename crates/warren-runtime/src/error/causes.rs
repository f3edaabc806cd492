//! The typed causes inside [`RuntimeError`](super::RuntimeError) and
//! [`StartCause`](super::StartCause): what went wrong is the variant, what the host said is
//! in its fields. Their messages are the ones users see.

use std::path::PathBuf;
use warren_types::Substrate;

/// The agent (or a helper thread of ours) said something the protocol does not allow here.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    /// A frame that does not parse as what its kind promises.
    #[error("{0}")]
    Frame(#[from] warren_proto::FrameError),
    /// A file the agent collected whose data is not base64.
    #[error("{0}")]
    Base64(#[from] base64::DecodeError),
    /// An event that does not belong where it came.
    #[error("unexpected {event}")]
    Unexpected { event: String },
    /// A start-up answer other than the one the step waits for.
    #[error("expected {expected}, got {got}")]
    Expected { expected: &'static str, got: String },
    /// A file write whose stream ended before the agent took all of it.
    #[error("write ended early")]
    WriteEndedEarly,
    /// The thread that opens a socket in a sandbox's network namespace ended silently.
    #[error("the network namespace thread ended without an answer")]
    NetnsThread,
}

/// Why a sandbox of an earlier daemon process cannot be taken over.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// The runtime record does not parse.
    #[error("bad record: {0}")]
    BadRecord(#[source] serde_json::Error),
    /// The record was written by another version of the runtime.
    #[error("record version {found} (this daemon reads {reads})")]
    RecordVersion { found: u32, reads: u32 },
    /// The sandbox's process (`what`: its agent, its QEMU) has gone.
    #[error("{what} is no longer running")]
    NotRunning { what: &'static str },
    /// The recorded process is not the sandbox's (a reused pid).
    #[error("{what} is not in the sandbox's cgroup")]
    NotInCgroup { what: &'static str },
    /// The agent's socket cannot be connected.
    #[error("agent socket: {0}")]
    AgentSocket(#[source] std::io::Error),
    /// A running agent that offers no socket to reconnect through.
    #[error("agent offers no reconnect socket: {0}")]
    NoReconnectSocket(#[source] warren_sys::SysError),
    /// The reconnect conversation broke off.
    #[error("{0}")]
    Frame(#[from] warren_proto::FrameError),
    /// The agent (`who`) did not answer the reconnect in time.
    #[error("{who} did not answer the reconnect")]
    NoAnswer { who: &'static str },
    /// The agent answered the reconnect with something else than ready.
    #[error("unexpected reconnect answer {answer}")]
    UnexpectedAnswer { answer: String },
    /// The sandbox's writable layer on disk cannot be taken back.
    #[error("its writable layer: {0}")]
    WritableLayer(#[source] Box<super::RuntimeError>),
    /// The blocking task that takes the writable layer back failed.
    #[error("writable layer task: {0}")]
    WritableLayerTask(#[source] tokio::task::JoinError),
    /// A writable layer on disk, and this daemon keeps none.
    #[error(
        "its writable layer is on disk ({}) and this daemon has no writable-layer store",
        dir.display()
    )]
    NoWritableStore { dir: PathBuf },
    /// A host id range, and this daemon has no id pool.
    #[error("it has host id range {base} and this daemon has no id pool")]
    NoIdPool { base: u32 },
    /// A host id range outside this node's pool.
    #[error("host id {base} is not a range of this node's pool")]
    IdNotInPool { base: u32 },
    /// A host id range another sandbox holds.
    #[error("host id range {base} is held by another sandbox")]
    IdHeld { base: u32 },
}

/// What a runtime cannot do (answered `unsupported_substrate`, or by the node as the
/// request not fitting the sandbox).
#[derive(Debug, thiserror::Error)]
pub enum Unsupported {
    /// Sandboxes of `substrate` do not have `op`.
    #[error("{} sandboxes {op}", substrate.as_str())]
    Operation { substrate: Substrate, op: Operation },
    /// This instance's substrate does not have `op`.
    #[error("this substrate {op}")]
    ThisSubstrate { op: Operation },
    /// Ports inside sandboxes of this substrate cannot be reached.
    #[error("ports inside sandboxes of this substrate cannot be reached")]
    Ports,
    /// The host has no cgroup freezer.
    #[error("no cgroup freezer on this host")]
    NoFreezer,
    /// A VM runtime asked for a substrate that is not a VM.
    #[error("{} is not a VM substrate", .0.as_str())]
    NotVm(Substrate),
    /// What a VM runtime needs on the host is missing.
    #[error("{0}")]
    VmHost(VmHostMissing),
    /// QEMU is there but does not run.
    #[error("{} cannot run ({source}): install qemu-system-x86 (scripts/setup.sh)", qemu.display())]
    QemuCannotRun {
        qemu: PathBuf,
        #[source]
        source: Box<super::RuntimeError>,
    },
    /// A runtime handed an instance of another runtime (`what` says which call).
    #[error("{what}")]
    ForeignInstance { what: &'static str },
    /// A host tool the call needs is not installed.
    #[error("{tool} is not installed")]
    NotInstalled { tool: String },
    /// A sandbox whose writable layer would be on disk, on a node that keeps none there.
    #[error("this node keeps writable layers in memory only: ask for disk_medium memory")]
    NoDiskMedium,
    /// A VM snapshot restored with another network than it was made with.
    #[error("{}", if *.snapshot_has_nic {
        "this snapshot's VM has a network interface: create from it with a network policy \
         other than none"
    } else {
        "this snapshot's VM has no network interface: create from it with network none"
    })]
    SnapshotNetwork { snapshot_has_nic: bool },
    /// A node with no substrate that runs function calls.
    #[error("this node serves no substrate that runs function calls")]
    NoFunctionSubstrate,
}

/// An operation a substrate may lack; its text completes "… sandboxes <op>".
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Operation {
    #[error("cannot serve function calls")]
    Function,
    #[error("cannot fork")]
    Fork,
    #[error("cannot be snapshotted")]
    Snapshot,
    #[error("cannot be captured as a layer")]
    Capture,
    #[error("cannot be made from a snapshot")]
    Restore,
    #[error("cannot pause")]
    Pause,
    #[error("cannot resume")]
    Resume,
}

/// What a VM runtime needs on the host and does not find.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmHostMissing {
    #[error("{} not found: install qemu-system-x86 (scripts/setup.sh)", .0.display())]
    Qemu(PathBuf),
    #[error("no guest kernel in {}: run scripts/build-guest.sh", .0.display())]
    Kernel(PathBuf),
    #[error("agent {} not found", .0.display())]
    Agent(PathBuf),
}

/// The virtual machine monitor (QEMU, its tools, its files) failed us.
#[derive(Debug, thiserror::Error)]
pub enum VmmError {
    /// A QMP conversation failed.
    #[error("{0}")]
    Qmp(#[from] QmpError),
    /// The blocking task that takes a disk lock failed.
    #[error("lock task: {0}")]
    LockTask(#[source] tokio::task::JoinError),
    /// The KVM probe's guest never came up (`log`: QEMU's log tail).
    #[error("no guest init under KVM{log}")]
    NoGuestInit { log: String },
    /// A snapshot's record does not parse.
    #[error("{}: {source}", path.display())]
    SnapshotRecord {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A snapshot of another format version.
    #[error("snapshot format {found} (this daemon reads {reads})")]
    SnapshotFormat { found: u32, reads: u32 },
    /// A VM whose RAM is a shared file is saved once, stopped.
    #[error("a VM whose RAM is a shared file is saved only once, stopped")]
    SharedRamKeepRunning,
    /// The snapshot's directory exists already.
    #[error("{} already exists", .0.display())]
    Exists(PathBuf),
    /// The guest kernel is no bzImage.
    #[error("{} is not a bzImage", .0.display())]
    NotBzImage(PathBuf),
    /// The guest kernel's setup code is larger than its header says.
    #[error("{}: setup code of {setup} bytes", kernel.display())]
    SetupCode { kernel: PathBuf, setup: usize },
    /// A QEMU tool (qemu-img, ...) failed.
    #[error("{} failed ({exit}): {stderr}", program.display())]
    Tool {
        program: PathBuf,
        exit: String,
        stderr: String,
    },
}

/// A QMP conversation with QEMU that failed.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("QMP socket {}: {source}", path.display())]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected QMP greeting {0}")]
    Greeting(String),
    #[error("QMP {cmd}: {source}")]
    Send {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP {cmd}: no answer in time")]
    NoAnswer { cmd: String },
    #[error("QMP {cmd}: {desc}")]
    Refused { cmd: String, desc: String },
    #[error("migration {status}: {error}")]
    MigrationFailed { status: String, error: String },
    #[error("migration still {status} after {after:?}")]
    MigrationSlow {
        status: String,
        after: std::time::Duration,
    },
    #[error("QMP read: {0}")]
    Read(#[source] std::io::Error),
    #[error("QMP connection closed (QEMU exited)")]
    Closed,
    #[error("QMP: bad JSON {line:?}: {source}")]
    BadJson {
        line: String,
        #[source]
        source: serde_json::Error,
    },
}

/// A node configuration that cannot work: the daemon refuses to start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("agent binary {} not found", .0.display())]
    AgentMissing(PathBuf),
    #[error(
        "the host id pool {start}..{end} overlaps the sandbox owner uids {owner_start}..{owner_end} \
         (--id-pool-base, --id-ranges, --sandbox-owner-uid-base)"
    )]
    IdPoolOverlapsOwners {
        start: u64,
        end: u64,
        owner_start: u64,
        owner_end: u64,
    },
    #[error(
        "id pool base {base} with {slots} ranges of {range}: the base must be a multiple of \
         {range} and the pool end below 2^32"
    )]
    IdPoolShape { base: u32, slots: u32, range: u32 },
}

/// Why a snapshot cannot be restored here.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The snapshot was made for another machine shape.
    #[error("snapshot {} was made for another machine ({made_for}); this sandbox is {this}", dir.display())]
    OtherMachine {
        dir: PathBuf,
        made_for: String,
        this: String,
    },
    /// The migration into the new VM failed (`log`: QEMU's log tail).
    #[error("restore: {source}{log}")]
    Restore {
        #[source]
        source: Box<super::RuntimeError>,
        log: String,
    },
    /// The snapshot's record of its layers does not parse.
    #[error("unreadable snapshot record: {0}")]
    Unreadable(#[source] serde_json::Error),
}
