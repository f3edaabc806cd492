"""Plain dataclasses for the API's answers. Field names follow the JSON of the v1 API."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

__all__ = [
    "Health",
    "Limits",
    "SandboxInfo",
    "ExecResult",
    "OutputChunk",
    "ProcessInfo",
    "FileStat",
]


@dataclass
class Health:
    """What ``GET /v1/health`` says about a node.

    Attributes:
        status: ``"ok"`` when the node serves requests.
        node: The node's id; it prefixes every sandbox id it makes.
        version: The daemon's version.
        substrates: The substrates this node serves (``["container"]``, ...).
        sandboxes: How many sandboxes the node holds, in any state.
        defaults: What the node applies when a request leaves it out: ``ttl_secs`` (lifetime
            of a sandbox created without one), ``max_ttl_secs`` and ``exec_timeout_secs``.
    """

    status: str
    node: str
    version: str
    substrates: List[str]
    sandboxes: int = 0
    defaults: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Health:
        """Builds a :class:`Health` from the decoded JSON answer."""
        return cls(
            status=d.get("status", ""),
            node=d.get("node", ""),
            version=d.get("version", ""),
            substrates=list(d.get("substrates", [])),
            sandboxes=int(d.get("sandboxes", 0)),
            defaults=dict(d.get("defaults") or {}),
        )


@dataclass
class Limits:
    """Resource limits of a sandbox after the node's defaults were applied.

    Attributes:
        cpus: CPU cores (fractions allowed), enforced as a CFS quota.
        memory_mb: Memory limit in MiB; the writable layer counts against it.
        disk_mb: Size limit of the writable layer in MiB.
        disk_medium: Where a container's writable layer lives: ``"disk"`` or ``"memory"``
            (``None`` for other substrates).
        pids: Maximum number of processes and threads.
        cpu_class: ``"normal"`` or ``"best_effort"``.
        trajectory_mb: Trajectory budget: output of calls beyond it is logged as sha256 and
            size only.
    """

    cpus: float
    memory_mb: int
    disk_mb: int
    pids: int
    cpu_class: str = "normal"
    trajectory_mb: int = 32
    disk_medium: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> Limits:
        """Builds :class:`Limits` from decoded JSON."""
        return cls(
            cpus=float(d.get("cpus", 0)),
            memory_mb=int(d.get("memory_mb", 0)),
            disk_mb=int(d.get("disk_mb", 0)),
            pids=int(d.get("pids", 0)),
            cpu_class=str(d.get("cpu_class", "normal")),
            trajectory_mb=int(d.get("trajectory_mb", 32)),
            disk_medium=d.get("disk_medium"),
        )


@dataclass
class SandboxInfo:
    """A sandbox as the node shows it (``SandboxInfo`` in the API).

    Attributes:
        id: ``<node>-<ulid>``, e.g. ``n1-01jd0m7x4e8k0k9yq1w2e3r4t5``.
        substrate: ``"container"``, ``"function"``, ``"microvm"`` or ``"vm"``.
        state: ``"creating"``, ``"running"``, ``"paused"``, ``"stopped"`` or ``"failed"``.
        image: The image refs as requested, lowest layer first.
        limits: The resolved resource limits.
        labels: The labels given at create.
        env: The environment of every command.
        workdir: The default working directory, if one was given.
        user: The default user, if one was given.
        network: The network policy: ``"none"``, or the policy dict when it allows something.
        created_at_ms: Creation time, Unix milliseconds.
        expires_at_ms: When the TTL deletes the sandbox, if it has one.
        idle_timeout_secs: The idle timeout, if one was given.
        last_activity_ms: Time of the last call, Unix milliseconds.
        reason: Why the sandbox stopped or failed, when it did.
        idempotency_key: The key given at create, if any.
        extra: Fields of the answer this SDK version does not know.
    """

    id: str
    substrate: str
    state: str
    image: List[str]
    limits: Limits
    labels: Dict[str, str] = field(default_factory=dict)
    env: Dict[str, str] = field(default_factory=dict)
    workdir: Optional[str] = None
    user: Optional[str] = None
    network: Union[str, Dict[str, Any]] = "none"
    created_at_ms: int = 0
    expires_at_ms: Optional[int] = None
    idle_timeout_secs: Optional[int] = None
    last_activity_ms: int = 0
    reason: Optional[str] = None
    idempotency_key: Optional[str] = None
    extra: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    _KNOWN = frozenset(
        "id substrate state image limits labels env workdir user network created_at_ms "
        "expires_at_ms idle_timeout_secs last_activity_ms reason idempotency_key".split()
    )

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> SandboxInfo:
        """Builds a :class:`SandboxInfo` from decoded JSON."""
        image = d.get("image", [])
        return cls(
            id=d["id"],
            substrate=d.get("substrate", "container"),
            state=d.get("state", ""),
            image=[image] if isinstance(image, str) else list(image),
            limits=Limits.from_json(d.get("limits") or {}),
            labels=dict(d.get("labels") or {}),
            env=dict(d.get("env") or {}),
            workdir=d.get("workdir"),
            user=d.get("user"),
            network=_network(d.get("network")),
            created_at_ms=int(d.get("created_at_ms") or 0),
            expires_at_ms=d.get("expires_at_ms"),
            idle_timeout_secs=d.get("idle_timeout_secs"),
            last_activity_ms=int(d.get("last_activity_ms") or 0),
            reason=d.get("reason"),
            idempotency_key=d.get("idempotency_key"),
            extra={k: v for k, v in d.items() if k not in cls._KNOWN},
        )


def _raw(value: str, encoding: str) -> bytes:
    """Output as raw bytes, whichever encoding carried it."""
    if encoding == "base64":
        return base64.b64decode(value)
    return value.encode("utf-8")


def _text(value: str, encoding: str) -> str:
    if encoding == "base64" and value:
        return base64.b64decode(value).decode("utf-8", "replace")
    return value


@dataclass
class ExecResult:
    """The outcome of a finished command.

    Attributes:
        exit_code: Exit status when the command exited normally, else ``None``.
        signal: Signal number when the command was killed by a signal, else ``None``.
        stdout: Captured standard output (up to the output cap), decoded as UTF-8 (``bytes``,
            undecoded, when the exec asked for ``binary=True``).
        stderr: Captured standard error (up to the output cap), likewise.
        stdout_truncated: True when stdout went past the cap and the rest was dropped.
        stderr_truncated: True when stderr went past the cap and the rest was dropped.
        timed_out: True when the command's timeout fired and its process tree was killed.
        duration: Wall time of the command in seconds, measured by the node.
        stdout_bytes: Total bytes written to stdout, captured or not.
        stderr_bytes: Total bytes written to stderr, captured or not.
        replayed: True when the call named a trajectory step that was already logged with the
            same request: this is the recorded result and nothing ran now.
        oom_killed: True when the OOM killer ended the command (``signal`` is then 9): the
            sandbox ran out of memory (its processes and writable layer share it).
    """

    exit_code: Optional[int]
    signal: Optional[int]
    stdout: Any  # str; bytes when the exec asked for binary=True
    stderr: Any
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration: float = 0.0
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    replayed: bool = False
    oom_killed: bool = False

    @property
    def truncated(self) -> bool:
        """True when either output stream was cut at the cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0

    @property
    def output(self) -> str:
        """``stdout`` followed by ``stderr``."""
        return self.stdout + self.stderr

    @classmethod
    def from_json(cls, d: Dict[str, Any], binary: bool = False) -> ExecResult:
        """Builds an :class:`ExecResult` from decoded JSON (either output encoding).

        With ``binary=True``, ``stdout`` and ``stderr`` are the raw bytes.
        """
        enc = d.get("encoding", "utf8")
        conv: Any = _raw if binary else _text
        return cls(
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            stdout=conv(d.get("stdout", ""), enc),
            stderr=conv(d.get("stderr", ""), enc),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            timed_out=bool(d.get("timed_out", False)),
            duration=float(d.get("duration_ms", 0.0)) / 1000.0,
            stdout_bytes=int(d.get("stdout_bytes", 0)),
            stderr_bytes=int(d.get("stderr_bytes", 0)),
            replayed=bool(d.get("replayed", False)),
            oom_killed=bool(d.get("oom_killed", False)),
        )


@dataclass
class OutputChunk:
    """A piece of a streamed command's output.

    Attributes:
        stream: ``"stdout"`` or ``"stderr"``.
        data: The text of this piece (UTF-8; a multi-byte character may be split only where
            the command itself split it).
    """

    stream: str
    data: str


@dataclass
class ProcessInfo:
    """A background process (``ProcessInfo`` in the API).

    Attributes:
        pid: The process id inside the sandbox.
        argv: The command line.
        state: ``"running"`` or ``"exited"``.
        exit_code: Exit status once exited normally.
        signal: Signal number once killed by a signal.
        started_at_ms: Start time, Unix milliseconds.
    """

    pid: int
    argv: List[str]
    state: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    started_at_ms: int = 0

    @property
    def running(self) -> bool:
        """True while the process runs."""
        return self.state == "running"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> ProcessInfo:
        """Builds a :class:`ProcessInfo` from decoded JSON."""
        return cls(
            pid=int(d["pid"]),
            argv=list(d.get("argv", [])),
            state=d.get("state", ""),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            started_at_ms=int(d.get("started_at_ms") or 0),
        )


@dataclass
class FileStat:
    """Metadata of one path inside a sandbox (symlinks are not followed).

    Attributes:
        name: The full path for ``stat``, the base name for ``list`` entries.
        kind: ``"file"``, ``"dir"``, ``"symlink"`` or ``"other"``.
        size: Size in bytes.
        mode: Permission bits (the ``0o7777`` part of ``st_mode``).
        uid: Owner user id.
        gid: Owner group id.
        mtime_ms: Modification time, Unix milliseconds.
        link_target: Where a symlink points, for symlinks.
    """

    name: str
    kind: str
    size: int
    mode: int
    uid: int = 0
    gid: int = 0
    mtime_ms: int = 0
    link_target: Optional[str] = None

    @property
    def is_dir(self) -> bool:
        """True for a directory."""
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        """True for a regular file."""
        return self.kind == "file"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> FileStat:
        """Builds a :class:`FileStat` from decoded JSON."""
        return cls(
            name=d.get("name", ""),
            kind=d.get("kind", "other"),
            size=int(d.get("size", 0)),
            mode=int(d.get("mode", 0)),
            uid=int(d.get("uid", 0)),
            gid=int(d.get("gid", 0)),
            mtime_ms=int(d.get("mtime_ms", 0)),
            link_target=d.get("link_target"),
        )


def _network(p: Any) -> Union[str, Dict[str, Any]]:
    """``"none"`` for a none policy in either spelling, else the policy dict."""
    if isinstance(p, dict) and p.get("mode", "none") != "none":
        return dict(p)
    return "none"


@dataclass
class Divergence:
    """The first replayed call of a revive whose outcome differs from the logged one.

    Attributes:
        step: The logged call's step (``None`` when it named none).
        seq: Its position in the old sandbox's trajectory.
        kind: Its kind (``"exec"``, ``"write_file"``, ...).
        expected: The logged outcome: ``error`` (a code, absent on success), ``exit_code``,
            ``signal``, ``stdout_sha256``, ``stderr_sha256``.
        got: The outcome of the replayed call, alike (``not_replayable`` says why a call
            could not run again).
    """

    step: Optional[int]
    seq: int
    kind: str
    expected: Dict[str, Any]
    got: Dict[str, Any]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Divergence":
        return cls(
            step=d.get("step"),
            seq=int(d.get("seq") or 0),
            kind=d.get("kind", ""),
            expected=dict(d.get("expected") or {}),
            got=dict(d.get("got") or {}),
        )


@dataclass
class ReviveReport:
    """What :meth:`AsyncClient.revive` did.

    Attributes:
        sandbox: The new sandbox (an :class:`~warren.AsyncSandbox`, or a
            :class:`~warren.Sandbox` from the blocking client).
        revived_from: The id of the sandbox whose trajectory was replayed.
        replayed: Logged calls run again.
        steps_replayed: Of them, calls that named a step.
        skipped: Entries not run again (pause, resume, terminals, cancelled calls, forks).
        last_step: The highest step of the new sandbox's trajectory: continue above it.
        divergences: How many replayed calls diverged.
        first_divergence: The first of them, if any.
        stopped: True when the replay stopped at the first divergence.
        duration_ms: Wall time of the revive on the node.
        recorded_ms: The sum of the logged durations of the replayed calls.
    """

    sandbox: Any
    revived_from: str
    replayed: int
    steps_replayed: int
    skipped: int
    last_step: Optional[int]
    divergences: int
    first_divergence: Optional[Divergence]
    stopped: bool
    duration_ms: float
    recorded_ms: float

    @property
    def next_step(self) -> int:
        """The step to run next in the new sandbox: above :attr:`last_step` (1 without one)."""
        return (self.last_step or 0) + 1

    @classmethod
    def from_json(cls, d: Dict[str, Any], sandbox: Any) -> "ReviveReport":
        first = d.get("first_divergence")
        return cls(
            sandbox=sandbox,
            revived_from=d.get("revived_from", ""),
            replayed=int(d.get("replayed") or 0),
            steps_replayed=int(d.get("steps_replayed") or 0),
            skipped=int(d.get("skipped") or 0),
            last_step=d.get("last_step"),
            divergences=int(d.get("divergences") or 0),
            first_divergence=Divergence.from_json(first) if first else None,
            stopped=bool(d.get("stopped")),
            duration_ms=float(d.get("duration_ms") or 0.0),
            recorded_ms=float(d.get("recorded_ms") or 0.0),
        )
