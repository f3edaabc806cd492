"""Function calls: one stateless command in a warm container (``POST /v1/functions/call``)."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Sequence, Union

__all__ = ["CallResult"]


def _raw(value: str, encoding: str) -> bytes:
    if encoding == "base64":
        return base64.b64decode(value) if value else b""
    return value.encode("utf-8")


@dataclass
class CallResult:
    """The outcome of :meth:`~warren.AsyncClient.call`.

    Attributes:
        exit_code: Exit status when the command exited normally, else ``None``.
        signal: Signal number when the command was killed by a signal, else ``None``.
        stdout: Captured standard output, decoded as UTF-8 (invalid bytes replaced).
        stderr: Captured standard error, decoded as UTF-8.
        stdout_truncated: True when stdout went past the cap.
        stderr_truncated: True when stderr went past the cap.
        timed_out: True when the call's timeout fired and everything it started was killed.
        duration: Seconds the node spent on the call, queueing included.
        queued: Seconds the call waited for a warm container.
        files: The files asked for with ``return_files``: path to raw bytes (missing ones
            are absent; see ``file_errors``).
        file_errors: Path to why it could not be read (``"not found"``, ...).
        files_truncated: Paths whose content was cut at the cap.
        stdout_bytes: Total bytes written to stdout, captured or not.
        stderr_bytes: Total bytes written to stderr, captured or not.
    """

    exit_code: Optional[int]
    signal: Optional[int]
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration: float = 0.0
    queued: float = 0.0
    files: Dict[str, bytes] = field(default_factory=dict)
    file_errors: Dict[str, str] = field(default_factory=dict)
    files_truncated: Sequence[str] = field(default_factory=list)
    stdout_bytes: int = 0
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> CallResult:
        """Builds a :class:`CallResult` from the decoded JSON answer (either encoding)."""
        enc = d.get("encoding", "utf8")
        files: Dict[str, bytes] = {}
        errors: Dict[str, str] = {}
        cut = []
        for f in d.get("files", []):
            if f.get("error"):
                errors[f["path"]] = f["error"]
                continue
            files[f["path"]] = _raw(f.get("content", ""), f.get("encoding", enc))
            if f.get("truncated"):
                cut.append(f["path"])
        return cls(
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            stdout=_raw(d.get("stdout", ""), enc).decode("utf-8", "replace"),
            stderr=_raw(d.get("stderr", ""), enc).decode("utf-8", "replace"),
            stdout_truncated=bool(d.get("stdout_truncated", False)),
            stderr_truncated=bool(d.get("stderr_truncated", False)),
            timed_out=bool(d.get("timed_out", False)),
            duration=float(d.get("duration_ms", 0.0)) / 1000.0,
            queued=float(d.get("queued_ms", 0.0)) / 1000.0,
            files=files,
            file_errors=errors,
            files_truncated=cut,
            stdout_bytes=int(d.get("stdout_bytes", 0)),
            stderr_bytes=int(d.get("stderr_bytes", 0)),
        )


def call_body(
    image: Union[str, Sequence[str]],
    cmd: Union[str, Sequence[Any]],
    *,
    files: Optional[Mapping[str, Union[str, bytes]]],
    stdin: Union[str, bytes, None],
    timeout: Optional[float],
    limits: Optional[Mapping[str, Any]],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    return_files: Optional[Sequence[str]],
    interpreter: Optional[str],
    preload: Optional[Sequence[str]],
    max_output: Optional[int],
    parse_mib: Any,
) -> Dict[str, Any]:
    """The JSON body of a call."""
    body: Dict[str, Any] = {"image": image if isinstance(image, str) else list(image), "encoding": "base64"}
    if isinstance(cmd, str):
        body["shell"] = cmd
    elif isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (shell) or a list of str (argv), not bytes")
    else:
        body["argv"] = [a if isinstance(a, str) else os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in cmd]
    if files:
        out = []
        for path, content in files.items():
            if isinstance(content, str):
                content = content.encode("utf-8")
            out.append({"path": path, "content": base64.b64encode(bytes(content)).decode(), "encoding": "base64"})
        body["files"] = out
    if stdin is not None:
        if isinstance(stdin, (bytes, bytearray, memoryview)):
            try:
                stdin = bytes(stdin).decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("stdin must be UTF-8 text; pass binary input as a file") from None
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout_secs"] = float(timeout)
    for key, value in (limits or {}).items():
        if key == "cpus":
            body["cpus"] = float(value)
        elif key in ("memory", "memory_mb"):
            body["memory_mb"] = parse_mib(value, "memory")
        elif key in ("disk", "disk_mb"):
            body["disk_mb"] = parse_mib(value, "disk")
        elif key == "pids":
            body["pids"] = int(value)
        else:
            raise ValueError(f"unknown limit {key!r} (cpus, memory, disk, pids)")
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if return_files:
        body["return_files"] = list(return_files)
    if interpreter is not None:
        body["interpreter"] = interpreter
    if preload:
        body["preload"] = list(preload)
    if max_output is not None:
        body["max_output_bytes"] = int(max_output)
    return body
