"""Commands: the request body of an exec, streamed commands and background processes."""

from __future__ import annotations

import base64 as _b64

import json as _json
import os
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, List, Mapping, Optional, Sequence, Union

import httpx

from ._errors import CommandError, ConnectionError, error_from_body
from ._models import ExecResult, OutputChunk, ProcessInfo
from ._transport import _CHUNK, _transport_error

if TYPE_CHECKING:
    from ._base import SandboxRef


#: A command: a string runs through ``/bin/sh -c``; a sequence is an argv run directly.
Command = Union[str, Sequence[str]]


def _exec_body(
    cmd: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: Union[str, bytes, None],
    user: Optional[str],
    timeout: Optional[float],
    max_output: Optional[int],
    step: Optional[int] = None,
    kill_tree: bool = False,
) -> Dict[str, Any]:
    if isinstance(cmd, str):
        body: Dict[str, Any] = {"shell": cmd}
    elif isinstance(cmd, (bytes, bytearray)):
        raise TypeError("cmd must be a str (shell) or a list of str (argv), not bytes")
    else:
        body = {
            "argv": [a if isinstance(a, str) else os.fspath(a) if isinstance(a, os.PathLike) else str(a) for a in cmd]
        }
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        if isinstance(stdin, (bytes, bytearray, memoryview)):
            # Any bytes: carried as base64.
            body["stdin"] = _b64.b64encode(bytes(stdin)).decode("ascii")
            body["stdin_encoding"] = "base64"
        else:
            body["stdin"] = stdin
    if kill_tree:
        body["kill_tree"] = True
    if timeout is not None:
        body["timeout_secs"] = float(timeout)
    if max_output is not None:
        body["max_output_bytes"] = int(max_output)
    if user is not None:
        body["user"] = user
    if step is not None:
        body["step"] = int(step)
    return body


class AsyncExecStream:
    """A command whose output arrives while it runs: an async iterator of :class:`OutputChunk`.

    Iterate it (``async for chunk in stream``); when the iteration ends, :attr:`result` holds
    the :class:`ExecResult`, whose ``stdout``/``stderr`` are the streamed text (kept up to
    the output cap). ``await stream.wait()`` drains the rest and returns the result. Leaving
    an ``async with`` block (or :meth:`aclose`) early closes the connection, which kills the
    command.
    """

    def __init__(self, sandbox: SandboxRef, body: Dict[str, Any], check: bool) -> None:
        self._sandbox = sandbox
        self._body = body
        self._check = check
        self._cap = int(body.get("max_output_bytes") or _CHUNK)
        self._resp: Optional[httpx.Response] = None
        self._lines: Optional[AsyncIterator[str]] = None
        self._out: List[str] = []
        self._err: List[str] = []
        self._sizes = [0, 0]
        self._done = False
        #: The command's result once the stream has ended, else ``None``.
        self.result: Optional[ExecResult] = None

    async def _start(self) -> None:
        http = self._sandbox._client._http
        self._resp = await http.stream(
            "POST",
            self._sandbox._path + "/exec/stream",
            json=self._body,
            timeout=http.call_timeout(self._body.get("timeout_secs"))
            if "timeout_secs" in self._body
            else http.call_timeout(None),
        )
        self._lines = self._resp.aiter_lines()

    def _keep(self, which: int, text: str) -> None:
        room = self._cap - self._sizes[which]
        if room <= 0:
            return
        buf = self._out if which == 0 else self._err
        if len(text) > room:
            text = text[:room]
        buf.append(text)
        self._sizes[which] += len(text)

    def __aiter__(self) -> AsyncExecStream:
        return self

    async def __anext__(self) -> OutputChunk:
        if self._done:
            raise StopAsyncIteration
        if self._resp is None:
            await self._start()
        assert self._lines is not None
        try:
            while True:
                try:
                    line = await self._lines.__anext__()
                except StopAsyncIteration:
                    raise ConnectionError("the exec stream ended without an exit event") from None
                except httpx.TransportError as e:
                    raise _transport_error(e, "exec stream") from e
                if not line:
                    continue
                ev = _json.loads(line)
                kind = ev.get("type")
                if kind == "stdout" or kind == "stderr":
                    data = ev.get("data", "")
                    self._keep(0 if kind == "stdout" else 1, data)
                    return OutputChunk(kind, data)
                if kind == "exit":
                    r = ExecResult.from_json(ev.get("result") or {})
                    r.stdout = "".join(self._out)
                    r.stderr = "".join(self._err)
                    self.result = r
                    await self.aclose()
                    if self._check and (r.exit_code != 0 or r.timed_out):
                        raise CommandError(self._body.get("shell") or self._body.get("argv"), r)
                    raise StopAsyncIteration
                if kind == "error":
                    await self.aclose()
                    raise error_from_body(None, {"error": ev.get("error") or {}})
                # Unknown event types are skipped, so newer nodes work with this SDK.
        except BaseException:
            if not self._done:
                await self.aclose()
            raise

    async def wait(self) -> ExecResult:
        """Drains the stream and returns the :class:`ExecResult`."""
        async for _ in self:
            pass
        if self.result is None:
            raise ConnectionError("the exec stream closed before the command's result arrived")
        return self.result

    async def aclose(self) -> None:
        """Closes the stream; a command still running is killed by the node."""
        self._done = True
        if self._resp is not None:
            await self._resp.aclose()

    async def __aenter__(self) -> AsyncExecStream:
        if self._resp is None:
            await self._start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


class AsyncProcess:
    """A background process started by :meth:`AsyncSandbox.spawn`.

    Attributes:
        pid: The process id inside the sandbox.
        sandbox: The sandbox it runs in.
        argv: The command line, when known.
    """

    def __init__(self, sandbox: SandboxRef, pid: int, argv: Optional[List[str]] = None) -> None:
        self.sandbox = sandbox
        self.pid = int(pid)
        self.argv = argv or []
        self._path = f"{sandbox._path}/processes/{self.pid}"

    def __repr__(self) -> str:
        return f"<Process {self.pid} in {self.sandbox.id}>"

    async def info(self) -> ProcessInfo:
        """The process's current :class:`ProcessInfo` (state, exit status)."""
        resp = await self.sandbox._client._http.request("GET", self._path, retry=True)
        return ProcessInfo.from_json(resp.json())

    async def wait(self, timeout: Optional[float] = None, *, check: bool = False) -> ExecResult:
        """Waits for the process to end and returns its result with the output it kept.

        Args:
            timeout: Seconds to wait; when the process is still running then, raises
                :class:`~warren.Timeout` and the process keeps running. ``None`` waits forever.
            check: Raise :class:`~warren.CommandError` when it did not exit with status 0.
        """
        http = self.sandbox._client._http
        params = None if timeout is None else {"timeout_secs": repr(float(timeout))}
        resp = await http.request("POST", self._path + "/wait", params=params, timeout=http.call_timeout(timeout))
        result = ExecResult.from_json(resp.json())
        if check and (result.exit_code != 0 or result.timed_out):
            raise CommandError(self.argv, result)
        return result

    async def kill(self, signal: int = 9) -> None:
        """Sends ``signal`` (default 9, SIGKILL) to the process's whole tree."""
        await self.sandbox._client._http.request("POST", self._path + "/kill", json={"signal": int(signal)})
