//! Protocol messages. All JSON; unknown fields are refused so a mismatched peer fails loudly.

use serde::{Deserialize, Serialize};
use warren_types::{FileStat, ProcessInfo};

/// A command to run inside the sandbox, as the agent sees it (defaults already merged by the
/// daemon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Full environment (the agent adds PATH/HOME/TERM defaults if missing).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Cap per output stream in bytes; more is counted and dropped.
    pub output_cap: u64,
    /// True when STDIN frames (ended by EOF) follow the call; else stdin is /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// Initial output credit in bytes; `None` means unlimited (bounded by `output_cap`).
    #[serde(default)]
    pub window: Option<u32>,
    /// When the command ends, kill everything it started (its process group and session,
    /// and orphans it left behind) — as a timeout does.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kill_tree: bool,
    /// A foreground command of a logged step: the agent runs it to its end even when the
    /// daemon goes away, and holds its result (output under the cap and exit) until the
    /// daemon releases the step, so a restarted daemon collects it instead of running the
    /// step again (see [`Call::Held`], [`Call::Collect`], [`Call::Release`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

/// What the agent keeps with a held command's result and hands back on [`Call::Held`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// The trajectory step the command runs for.
    pub step: u64,
    /// The daemon's own note (the logged request), returned as it was given.
    pub note: String,
}

/// A held command as [`Call::Held`] lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeldStep {
    pub step: u64,
    pub note: String,
    /// True once the command has ended (a [`Call::Collect`] answers at once).
    pub done: bool,
}

/// A request from the daemon; opens a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// Liveness and version check. → `Pong`.
    Ping,
    /// Run a command; output as STDOUT/STDERR frames. → `Started`, then `Exited`.
    Exec { spec: ExecSpec },
    /// Start a background process; its output is kept (up to the cap) for `Wait`. → `Started`.
    Spawn { spec: ExecSpec },
    /// → `Procs`.
    ListProcs,
    /// Wait for a background process; its kept output follows as frames. → `Exited` or
    /// `Error{code: timeout}`.
    Wait { pid: u32, timeout_ms: Option<u64> },
    /// Signal a background process's whole tree. → `Done`.
    Kill { pid: u32, signal: i32 },
    /// Run a command on a new terminal; STDIN frames are keystrokes, STDOUT frames the screen.
    /// → `Started`, then `Exited`.
    Pty {
        spec: ExecSpec,
        cols: u16,
        rows: u16,
    },
    /// Read a file; contents as STDOUT frames (credit-limited). → `Done`.
    ReadFile { path: String, window: u32 },
    /// Write the STDIN frames that follow until EOF to a new file beside `path`, then rename
    /// it over `path` (a failed or cancelled write leaves nothing). With `size`, the free
    /// space is checked first and a different length fails. → `Done`.
    WriteFile {
        path: String,
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size: Option<u64>,
    },
    /// Pack a directory's tree (or one file) as a tar stream; STDOUT frames
    /// (credit-limited). → `Done`.
    ReadTar { path: String, window: u32 },
    /// Unpack the tar stream of the STDIN frames that follow (until EOF) under a directory,
    /// made when missing. → `Done`.
    WriteTar { path: String },
    /// → `Stat`.
    Stat { path: String },
    /// → `Entries`: at most `limit` entries (and about 8 MiB) in
    /// name order, starting after the name `after`; `next` names the last one when more follow.
    List {
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
    },
    /// → `Done`.
    Mkdir {
        path: String,
        parents: bool,
        mode: Option<u32>,
    },
    /// → `Done`.
    Remove { path: String, recursive: bool },
    /// → `Done`.
    Chmod { path: String, mode: u32 },
    /// VM guests only: configures the guest's network interface (`eth0`) as given, or takes
    /// its address and route away (`None`), then writes `resolv_conf` (when given) to
    /// `/etc/resolv.conf`: one call, so a create pays one round trip to the guest. → `Done`.
    Network {
        config: Option<GuestNet>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resolv_conf: Option<String>,
    },
    /// Function containers only: run one stateless call in a fresh call environment (see
    /// [`InvokeSpec`]). STDIN frames carry the files' contents (in order, `size` bytes each)
    /// then the command's stdin, ended by EOF. → `Started`, STDOUT/STDERR frames, one
    /// `Collected` per requested path, then `Exited`.
    Invoke { spec: InvokeSpec },
    /// Connects to TCP `127.0.0.1:port` inside the sandbox and relays bytes: STDIN frames
    /// go to the connection (EOF half-closes it), what it sends comes back as STDOUT frames
    /// (credit-limited, `window` bytes at first). → `Connected` (not final), then `Done`
    /// when the connection's far end has closed, or `Error{code: port_unreachable}` when
    /// nothing listens.
    Connect { port: u16, window: u32 },
    /// The held commands (see [`ExecSpec::hold`]), running or ended. → `Held`.
    Held,
    /// Waits for held command `step` to end; its kept output follows as frames. → `Exited`
    /// (`HeldExited` when the run was disturbed: its stdin was cut off when the daemon went
    /// away), or `Error{code: not_found}`.
    Collect { step: u64 },
    /// Forgets held command `step` (its result is logged). → `Done`, also when not held.
    Release { step: u64 },
}

/// The network of a VM guest's one interface: its MAC, address and gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestNet {
    /// `xx:xx:xx:xx:xx:xx`, a fresh one per sandbox (a template's snapshot carries its own).
    pub mac: String,
    pub address: std::net::Ipv4Addr,
    pub prefix_len: u8,
    pub gateway: std::net::Ipv4Addr,
    pub mtu: u32,
}

/// One stateless call: files written first, the command, files read back after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct InvokeSpec {
    /// The command (`stdin` says whether it gets the input left after the files).
    pub exec: ExecSpec,
    #[serde(default)]
    pub files: Vec<InvokeFile>,
    /// Paths read back after the command ended.
    #[serde(default)]
    pub collect: Vec<String>,
    /// Most bytes returned per collected file (more is marked `truncated`).
    #[serde(default)]
    pub collect_cap: u64,
}

/// A file written into the call environment before the command starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct InvokeFile {
    pub path: String,
    /// Its length: the next `size` bytes of the call's input.
    pub size: u64,
    #[serde(default)]
    pub mode: Option<u32>,
}

/// What a function container pre-starts in each call environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct FunctionInit {
    /// A Python interpreter (program name or path) started ahead of the call; calls of the
    /// form `python3 -c CODE ...` or `python3 SCRIPT ...` are handed to it.
    #[serde(default)]
    pub interpreter: Option<String>,
    /// Modules the interpreter imports while it waits.
    #[serde(default)]
    pub preload: Vec<String>,
}

/// A live-stream control message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Control {
    Resize { cols: u16, rows: u16 },
}

/// One process known to the agent.
pub type ProcEntry = ProcessInfo;

/// A reply from the agent on a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "ev", rename_all = "snake_case", deny_unknown_fields)]
pub enum Event {
    Pong {
        version: u32,
        pid: u32,
    },
    Started {
        pid: u32,
    },
    /// A function call waited this long for its call environment (cell) to be ready; sent
    /// by a function container's agent before the call's own events.
    CellWaited {
        us: u64,
    },
    Exited(warren_types::ExitInfo),
    Procs {
        procs: Vec<ProcEntry>,
    },
    Stat {
        stat: FileStat,
    },
    Entries {
        entries: Vec<FileStat>,
        /// Set when more entries follow: ask again with `after` = this name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<String>,
    },
    Done,
    /// A `Connect` reached its port; the relay starts (not final).
    Connected,
    /// A file read back after an `Invoke` (not final). `data` is base64.
    Collected {
        path: String,
        data: String,
        size: u64,
        truncated: bool,
        error: Option<String>,
    },
    /// The answer to `Held`.
    Held {
        steps: Vec<HeldStep>,
    },
    /// A collected command whose run was disturbed by the daemon's going away (its stdin
    /// was cut off before its end): how it ended, which is not the requested run's result.
    HeldExited(warren_types::ExitInfo),
    /// Ends the stream with an error.
    Error {
        code: warren_types::ErrorCode,
        message: String,
    },
}

impl Event {
    /// True for events that close their stream.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Event::Started { .. }
                | Event::Collected { .. }
                | Event::CellWaited { .. }
                | Event::Connected
        )
    }

    pub fn error(code: warren_types::ErrorCode, message: impl Into<String>) -> Self {
        Event::Error {
            code,
            message: message.into(),
        }
    }
}

/// Start-up configuration of a container sandbox, sent to the agent before it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerInit {
    /// Read-only lower layers as host paths, **topmost first** (overlayfs order).
    pub lowerdirs: Vec<String>,
    /// Size limit of the writable layer (a tmpfs inside the sandbox's mount namespace, unless
    /// `writable_dir` is given).
    pub disk_mb: u64,
    /// The host directory that holds the writable layer on disk (its owner is the sandbox's
    /// root, its quota is `disk_mb`): the agent makes `upper`, `work`, the overlay's mount
    /// point and `/dev` in it instead of in a tmpfs. Not sent when absent (memory medium).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writable_dir: Option<String>,
    /// The layers come as detached read-only mounts idmapped to the sandbox's own id range,
    /// passed (`SCM_RIGHTS`, one byte) just before [`Init::Mapped`], topmost first like
    /// `lowerdirs` (which then only names them); the agent attaches them in its own mount
    /// namespace. Not sent when false (the layers are the host paths of `lowerdirs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layer_trees: bool,
    pub hostname: String,
    /// Paths bind-masked with an empty file/dir (e.g. /proc/kpagecgroup).
    pub masked_paths: Vec<String>,
    /// Paths remounted read-only (e.g. /proc/sys).
    pub readonly_paths: Vec<String>,
    /// Apply the seccomp allow-list to everything the agent starts.
    pub seccomp: bool,
    /// Set for a function container: the agent keeps the image layers, serves only `Invoke`
    /// (and `Ping`), and runs each call in a fresh environment of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionInit>,
    /// Enter the sandbox's Landlock domain (best effort by the kernel's ABI).
    #[serde(default)]
    pub landlock: bool,
    /// Best-effort CPU class: commands run under `SCHED_IDLE` and cannot leave it.
    #[serde(default)]
    pub best_effort: bool,
    /// AppArmor profile every command is confined under (hosts with AppArmor only).
    #[serde(default)]
    pub apparmor_profile: Option<String>,
    /// A read-only sysfs shared by every sandbox of the node (mounted once by the daemon, in
    /// a network namespace of its own), bound at `/sys` instead of a sysfs per sandbox.
    /// `None`: the sandbox mounts a sysfs of its own network namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysfs: Option<String>,
    /// Mount the sandbox's own devpts at start. Otherwise `/dev/pts` stays empty until the
    /// first terminal call, when the daemon mounts it (each devpts is a superblock, and every
    /// superblock costs a shrinker in every memory cgroup of the host).
    #[serde(default)]
    pub devpts: bool,
    /// `/etc/resolv.conf` of a sandbox that starts with a network link (naming its resolver);
    /// `None`: the sandbox starts with no network and a resolv.conf that says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolv_conf: Option<String>,
    /// Host uid (and gid) that makes, so owns, the sandbox's user namespace. The kernel
    /// charges the per-user counts of a namespace (`/proc/sys/user/*`: inotify instances and
    /// watches, fanotify groups and marks, namespaces) to its owner in the parent namespace:
    /// one uid per sandbox gives each sandbox counts of its own, where host root would
    /// share root's with every sandbox and the host. `None`: made as host root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
    /// Limits of the sandbox's own user namespace, written to `/proc/sys/user/<name>` once
    /// it exists (at most the host's per-user limit applies on top, through the owner).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_limits: Vec<UserLimit>,
    /// How many `cgroup.procs` files of the commands' leaf group (one per cgroup hierarchy
    /// that has one) follow the layer mounts as passed descriptors (`SCM_RIGHTS`, one
    /// byte), before [`Init::Mapped`]. The daemon opened them: the agent moves each command
    /// it starts into the leaf by writing to them, so an OOM kill among the commands never
    /// takes the agent. 0: no leaf (commands stay in the sandbox's groups).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub command_groups: u8,
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}

/// One count of `/proc/sys/user/` (e.g. `max_inotify_watches`) and its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserLimit {
    pub name: String,
    pub value: u64,
}

impl UserLimit {
    /// Parses `NAME=VALUE` where NAME is a count of `/proc/sys/user/` (lower-case letters and
    /// underscores, starting with `max_`).
    pub fn parse(s: &str) -> Result<UserLimit, String> {
        let (name, value) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected NAME=VALUE"))?;
        let name = name.trim();
        if !name.starts_with("max_")
            || name.len() > 64
            || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        {
            return Err(format!(
                "{name:?} is not a count of /proc/sys/user (e.g. max_inotify_watches)"
            ));
        }
        let value = value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|v| *v <= i32::MAX as u64)
            .ok_or_else(|| format!("{name}: the value must be a number up to {}", i32::MAX))?;
        Ok(UserLimit {
            name: name.to_string(),
            value,
        })
    }
}

/// Daemon → agent on stream 0 during start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Init {
    /// Set up a container sandbox: unshare, wait for `Mapped`, fork PID 1, build the rootfs.
    Container {
        version: u32,
        config: Box<ContainerInit>,
    },
    /// The daemon wrote the uid/gid maps.
    Mapped,
    /// A (re)connected daemon greets an agent that already serves. `hostname`, when given,
    /// is set first (a VM restored from a template takes the new sandbox's name).
    Hello {
        version: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hostname: Option<String>,
    },
}

/// Agent → daemon on stream 0 during start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum InitReply {
    /// Namespaces exist; write the uid/gid maps of `pid`, then send `Mapped`.
    Unshared { pid: u32 },
    /// PID 1 of the sandbox, as a host pid.
    Child { pid: u32 },
    /// The sandbox serves calls.
    Ready { version: u32 },
    /// Start-up failed; nothing of the sandbox should be kept.
    Failed { message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let calls = vec![
            Call::Ping,
            Call::Exec {
                spec: ExecSpec {
                    argv: vec!["true".into()],
                    output_cap: 10,
                    ..Default::default()
                },
            },
            Call::Wait {
                pid: 3,
                timeout_ms: Some(5),
            },
            Call::ReadFile {
                path: "/etc/hostname".into(),
                window: 65536,
            },
            Call::Exec {
                spec: ExecSpec {
                    argv: vec!["sleep".into(), "1".into()],
                    hold: Some(Hold {
                        step: 7,
                        note: "{}".into(),
                    }),
                    ..Default::default()
                },
            },
            Call::Held,
            Call::Collect { step: 7 },
            Call::Release { step: 7 },
        ];
        for c in calls {
            let s = serde_json::to_string(&c).unwrap();
            assert_eq!(serde_json::from_str::<Call>(&s).unwrap(), c);
        }
        assert!(serde_json::from_str::<Call>(r#"{"op":"format_disk"}"#).is_err());
        let e = Event::Exited(warren_types::ExitInfo {
            exit_code: Some(0),
            stdout_bytes: 1,
            duration_us: 5,
            ..Default::default()
        });
        assert!(e.is_final());
        // The exit is flat beside the tag on the wire, as before it was its own type.
        let wire = serde_json::to_value(&e).unwrap();
        assert_eq!(wire["ev"], "exited");
        assert_eq!(wire["duration_us"], 5);
        assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), e);
        let err = Event::error(warren_types::ErrorCode::NotFound, "gone");
        let wire = serde_json::to_value(&err).unwrap();
        assert_eq!(wire["code"], "not_found");
        assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), err);
        assert!(!Event::Started { pid: 1 }.is_final());
        assert!(!Event::CellWaited { us: 1 }.is_final());
        let held = Event::Held {
            steps: vec![HeldStep {
                step: 3,
                note: "n".into(),
                done: false,
            }],
        };
        assert!(held.is_final());
        let wire = serde_json::to_string(&held).unwrap();
        assert_eq!(serde_json::from_str::<Event>(&wire).unwrap(), held);
        // A command without a hold says nothing of one on the wire (older agents read it).
        let plain = serde_json::to_value(ExecSpec::default()).unwrap();
        assert!(plain.get("hold").is_none());
    }
}
