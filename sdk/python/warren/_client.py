"""The asyncio client: the one implementation of the SDK. The sync client wraps it."""

from __future__ import annotations

import asyncio
import datetime
import json as _json
import os
import random
import re
from typing import (
    IO,
    Any,
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)
from urllib.parse import quote, urlencode, urlsplit

import httpx

from ._errors import (
    Busy,
    CommandError,
    ConnectionError,
    NotFound,
    Timeout,
    Unsupported,
    WarrenError,
    error_from_body,
)
from ._failover import BROKEN, GIVE_UP, NEXT_URL, NOT_SENT, Plan, split_urls
from ._function import CallResult, call_body
from ._models import ExecResult, FileStat, Health, OutputChunk, ProcessInfo, SandboxInfo
from ._pool import PoolTransport

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncExecStream",
    "AsyncPty",
    "AsyncTrajectory",
    "DEFAULT_URL",
    "Command",
]

T = TypeVar("T")

#: Where the SDK looks for a node when neither ``url`` nor ``WARREN_URL`` says.
DEFAULT_URL = "unix:///run/warren/warren.sock"

#: A command: a string runs through ``/bin/sh -c``; a sequence is an argv run directly.
Command = Union[str, Sequence[str]]

_VERSION = "0.1.0"
_CHUNK = 1 << 20
# Extra seconds the HTTP call waits past a command's own timeout before giving up on the node.
_MARGIN = 30.0
_KNOWN_UNITS = {
    "": 1,
    "k": 1 / 1024,
    "ki": 1 / 1024,
    "kb": 1 / 1024,
    "kib": 1 / 1024,
    "m": 1,
    "mi": 1,
    "mb": 1,
    "mib": 1,
    "g": 1024,
    "gi": 1024,
    "gb": 1024,
    "gib": 1024,
    "t": 1024 * 1024,
    "ti": 1024 * 1024,
    "tb": 1024 * 1024,
    "tib": 1024 * 1024,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def network_policy(
    policy: Union[str, Mapping[str, Any], None] = None,
    *,
    allow: Optional[Sequence[Union[str, Mapping[str, Any]]]] = None,
    services: Optional[Mapping[str, bool]] = None,
    domains: Optional[Sequence[str]] = None,
) -> Union[str, Dict[str, Any]]:
    """The JSON of a network policy: ``policy`` as given (``"none"`` or a policy dict), or an
    ``allow`` policy made of ``allow`` rules (dicts ``{"cidr", "ports", "protocol"}`` or strings
    ``"CIDR[:PORTS[:PROTO]]"`` like ``"10.254.1.0/24:443:tcp"``), named ``services``
    (``{"pypi": True}``) and ``domains``."""
    listed = allow is not None or services is not None or domains is not None
    if policy is not None:
        if listed:
            raise ValueError("give either a policy or allow/services/domains, not both")
        return policy if isinstance(policy, str) else dict(policy)
    if not listed:
        return "none"
    rules: List[Dict[str, Any]] = []
    for r in allow or []:
        if isinstance(r, str):
            parts = r.split(":", 2)
            rule: Dict[str, Any] = {"cidr": parts[0]}
            if len(parts) > 1:
                rule["ports"] = int(parts[1]) if parts[1].isdigit() else parts[1]
            if len(parts) > 2:
                rule["protocol"] = parts[2]
            rules.append(rule)
        else:
            rules.append(dict(r))
    return {"mode": "allow", "allow": rules, "services": dict(services or {}), "domains": list(domains or [])}


def _is_none_policy(p: Any) -> bool:
    return p is None or p == "none" or (isinstance(p, dict) and p.get("mode", "none") == "none")


def parse_mib(value: Union[int, float, str, None], what: str = "size") -> Optional[int]:
    """Converts a size to MiB: an int is MiB already; a string may carry a unit.

    ``"512M"``, ``"512MiB"``, ``"1G"``, ``"1.5GiB"`` and ``"65536K"`` are understood (all
    binary units). ``None`` stays ``None``.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number of MiB or a string like '512M', got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"{what} must be positive, got {value!r}")
        return int(value)
    m = _SIZE_RE.match(str(value))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _KNOWN_UNITS:
        raise ValueError(f"{what} must be a number of MiB or a string like '512M' or '1G', got {value!r}")
    mib = float(m.group(1)) * _KNOWN_UNITS[unit]
    if mib < 1:
        raise ValueError(f"{what} must be at least 1 MiB, got {value!r}")
    return int(mib)


def _secs(value: Union[int, float, datetime.timedelta, None], what: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be seconds or a timedelta, got {value!r}")
    return max(1, int(-(-value // 1)))  # ceil, at least 1


def _parse_url(url: Optional[str]) -> Tuple[str, Optional[str]]:
    """Returns ``(base_url, unix_socket_path_or_None)``."""
    url = url or os.environ.get("WARREN_URL") or DEFAULT_URL
    if url.startswith("unix:"):
        path = url[len("unix:") :]
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(f"a unix URL needs an absolute socket path (unix:///run/warren/warren.sock), got {url!r}")
        return "http://warren", path
    if url.startswith("/"):
        return "http://warren", url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url must be unix:///path.sock or http://host:port, got {url!r}")
    return url.rstrip("/"), None


def _exec_body(
    cmd: Command,
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: Union[str, bytes, None],
    user: Optional[str],
    timeout: Optional[float],
    max_output: Optional[int],
    step: Optional[int] = None,
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
            try:
                stdin = bytes(stdin).decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError("stdin must be UTF-8 text; upload binary input as a file and redirect it") from None
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout_secs"] = float(timeout)
    if max_output is not None:
        body["max_output_bytes"] = int(max_output)
    if user is not None:
        body["user"] = user
    if step is not None:
        body["step"] = int(step)
    return body


def _step_params(params: Dict[str, Any], step: Optional[int]) -> Dict[str, Any]:
    if step is not None:
        params["step"] = str(int(step))
    return params


def _backoff(attempt: int, base: float = 0.05, cap: float = 5.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2**attempt)))


def _raise_for(resp: httpx.Response) -> None:
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    raise error_from_body(resp.status_code, body, resp.headers.get("retry-after"))


def _transport_error(e: Exception, what: str) -> WarrenError:
    if isinstance(e, httpx.TimeoutException):
        return Timeout(f"{what}: the HTTP call timed out ({type(e).__name__})", code="timeout")
    return ConnectionError(f"{what}: {type(e).__name__}: {e}")


def _raise_fd_limit(want: int) -> None:
    """Raises the soft open-files limit towards ``want`` (thousands of connections need it)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < want:
            target = want if hard == resource.RLIM_INFINITY else min(want, hard)
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # pragma: no cover - best effort
        pass


class _Target:
    """One URL and its connection pool."""

    def __init__(self, url: Optional[str], timeout: httpx.Timeout, max_connections: int) -> None:
        self.base_url, self.uds = _parse_url(url)
        self.url = f"unix://{self.uds}" if self.uds else self.base_url
        # httpx's own pool costs O(open connections) per call; ours is O(1) at any size.
        transport = PoolTransport(self.uds, max_connections=max_connections, keepalive_expiry=30.0)
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=timeout,
            headers={"user-agent": f"warren-python/{_VERSION}"},
        )


class _Http:
    """The pooled HTTP connections to a node or to the gateways of a cluster, with the retry
    and failover policy of :mod:`warren._failover`."""

    def __init__(
        self,
        url: Union[str, Sequence[str], None],
        timeout: float,
        max_connections: int,
        max_retries: int,
    ) -> None:
        self.max_retries = max_retries
        self.timeout = httpx.Timeout(connect=10.0, read=timeout, write=timeout, pool=None)
        if isinstance(url, str) and "," not in url:
            urls: List[Optional[str]] = [url]
        elif url is None:
            env = os.environ.get("WARREN_URL")
            urls = split_urls(env) if env else [None]
        else:
            urls = split_urls(url)
        self.targets = [_Target(u, self.timeout, max_connections) for u in urls]
        # The target that answered last: calls start there.
        self.preferred = 0
        _raise_fd_limit(max_connections * len(self.targets) + 1024)

    @property
    def _current(self) -> _Target:
        return self.targets[self.preferred]

    @property
    def client(self) -> httpx.AsyncClient:
        return self._current.client

    @property
    def base_url(self) -> str:
        return self._current.base_url

    @property
    def uds(self) -> Optional[str]:
        return self._current.uds

    @property
    def url(self) -> str:
        return self._current.url

    @property
    def urls(self) -> List[str]:
        return [t.url for t in self.targets]

    async def aclose(self) -> None:
        for t in self.targets:
            await t.client.aclose()

    def call_timeout(self, seconds: Optional[float]) -> httpx.Timeout:
        """A timeout whose read part waits for ``seconds`` plus a margin (``None``: forever)."""
        read = None if seconds is None else float(seconds) + _MARGIN
        return httpx.Timeout(connect=10.0, read=read, write=self.timeout.write, pool=None)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        content: Any = None,
        timeout: Any = None,
        retry: bool = False,
    ) -> httpx.Response:
        """One call; raises the mapped :class:`WarrenError` on an error answer.

        A request that could not be sent goes to the next URL. With ``retry`` (the call is
        safe to repeat), broken connections and ``503`` answers go to the next URL too, and
        ``busy`` answers are waited for, honouring the server's ``retry_after``.
        """
        return await self._send(method, path, json, params, content, timeout, retry, stream=False)

    async def stream(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        content: Any = None,
        timeout: Any = None,
        retry: bool = False,
    ) -> httpx.Response:
        """Like :meth:`request` but returns the answer unread (the caller closes it)."""
        return await self._send(method, path, json, params, content, timeout, retry, stream=True)

    async def _send(
        self,
        method: str,
        path: str,
        json: Any,
        params: Any,
        content: Any,
        timeout: Any,
        retry: bool,
        stream: bool,
    ) -> httpx.Response:
        # A streamed upload (an async iterator) cannot be sent twice.
        replayable = content is None or isinstance(content, (bytes, bytearray, str))
        plan = Plan(len(self.targets), self.max_retries, retry and replayable)
        first = idx = self.preferred
        while True:
            target = self.targets[idx]
            req = target.client.build_request(
                method,
                path,
                json=json,
                params=params,
                content=content,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            try:
                resp = await target.client.send(req, stream=stream)
            except httpx.TransportError as e:
                err: WarrenError = _transport_error(e, f"{method} {path} at {target.url}")
                if isinstance(e, httpx.ReadTimeout) and not stream:
                    raise err from e
                not_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                # An unsent request's body was not read, so even a stream may go elsewhere.
                step = plan.after(NOT_SENT if not_sent else BROKEN)
                if step == GIVE_UP:
                    raise err from e
            else:
                if resp.status_code < 400:
                    self.preferred = idx
                    return resp
                if stream:
                    try:
                        await resp.aread()
                    finally:
                        await resp.aclose()
                try:
                    _raise_for(resp)
                except WarrenError as e:
                    err = e
                step = plan.after((resp.status_code, err.retry_after, err.code))
                if step == GIVE_UP:
                    if idx != first:
                        self.preferred = idx  # it answered: later calls start with it
                    raise err
            if step == NEXT_URL:
                idx = (idx + 1) % len(self.targets)
            else:
                await asyncio.sleep(float(step))
                idx = self.preferred


class AsyncExecStream:
    """A command whose output arrives while it runs: an async iterator of :class:`OutputChunk`.

    Iterate it (``async for chunk in stream``); when the iteration ends, :attr:`result` holds
    the :class:`ExecResult`, whose ``stdout``/``stderr`` are the streamed text (kept up to
    the output cap). ``await stream.wait()`` drains the rest and returns the result. Leaving
    an ``async with`` block (or :meth:`aclose`) early closes the connection, which kills the
    command.
    """

    def __init__(self, sandbox: AsyncSandbox, body: Dict[str, Any], check: bool) -> None:
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

    def __init__(self, sandbox: AsyncSandbox, pid: int, argv: Optional[List[str]] = None) -> None:
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


class AsyncFiles:
    """File calls of one sandbox (``sandbox.files``). Paths are absolute inside the sandbox."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._path = sandbox._path + "/files"

    @property
    def _http(self) -> _Http:
        return self._sandbox._client._http

    async def read(self, path: str) -> bytes:
        """Returns the whole content of the file at ``path`` (use :meth:`download` for big files)."""
        resp = await self._http.request("GET", self._path, params={"path": path}, retry=True)
        return resp.content

    async def read_text(self, path: str, encoding: str = "utf-8", errors: str = "strict") -> str:
        """Returns the file at ``path`` decoded as text."""
        return (await self.read(path)).decode(encoding, errors)

    async def iter_read(self, path: str, chunk_size: Optional[int] = _CHUNK) -> AsyncGenerator[bytes, None]:
        """Yields the file at ``path`` in chunks, never holding it whole.

        Chunks are about ``chunk_size`` bytes (the last one is smaller); ``None`` yields the
        pieces as they arrive from the node.
        """
        resp = await self._http.stream("GET", self._path, params={"path": path}, retry=True)
        try:
            if not chunk_size:
                async for piece in resp.aiter_raw():
                    yield piece
                return
            pieces: List[bytes] = []
            size = 0
            async for piece in resp.aiter_raw():
                pieces.append(piece)
                size += len(piece)
                if size >= chunk_size:
                    yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
                    pieces, size = [], 0
            if pieces:
                yield b"".join(pieces)
        except httpx.TransportError as e:
            raise _transport_error(e, f"reading {path}") from e
        finally:
            await resp.aclose()

    async def write(
        self,
        path: str,
        data: Union[bytes, bytearray, memoryview, str, IO[bytes], AsyncIterable[bytes]],
        mode: Optional[int] = None,
        *,
        step: Optional[int] = None,
    ) -> None:
        """Creates or truncates the file at ``path`` and writes ``data`` to it.

        Args:
            path: Absolute path inside the sandbox; the parent directory must exist.
            data: Bytes, text (written as UTF-8), a binary file object (read in chunks) or an
                async iterable of bytes (streamed as it comes).
            mode: Permission bits, e.g. ``0o755``; the node's default when ``None``.
            step: The caller's trajectory step (see :meth:`AsyncSandbox.exec`). A step already
                logged with the same path, mode and content writes nothing.
        """
        params: Dict[str, Any] = _step_params({"path": path}, step)
        if mode is not None:
            params["mode"] = str(int(mode))
        content: Any
        if isinstance(data, str):
            content = data.encode("utf-8")
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content = bytes(data)
        elif hasattr(data, "read"):
            content = _aiter_file(data)  # type: ignore[arg-type]
        else:
            content = data
        await self._http.request(
            "PUT", self._path, params=params, content=content, timeout=self._http.call_timeout(None)
        )

    async def upload(
        self,
        local_path: Union[str, os.PathLike[str]],
        remote_path: str,
        mode: Optional[int] = None,
        *,
        step: Optional[int] = None,
    ) -> int:
        """Copies a local file into the sandbox, streamed in 1 MiB chunks. Returns the byte count.

        Memory stays flat whatever the file's size.
        """
        sent = 0

        async def chunks() -> AsyncIterator[bytes]:
            nonlocal sent
            async for chunk in _aiter_file(open(local_path, "rb"), close=True):
                sent += len(chunk)
                yield chunk

        await self.write(remote_path, chunks(), mode=mode, step=step)
        return sent

    async def download(self, remote_path: str, local_path: Union[str, os.PathLike[str]]) -> int:
        """Copies a file out of the sandbox to ``local_path``, streamed. Returns the byte count.

        Memory stays flat whatever the file's size. A failed transfer removes the partial file.
        """
        loop = asyncio.get_running_loop()
        total = 0
        f = open(local_path, "wb")
        ok = False
        try:
            # One write in flight while the next chunk arrives; at most two chunks in memory.
            pending: Optional[asyncio.Future[Any]] = None
            async for chunk in self.iter_read(remote_path, _CHUNK):
                if pending is not None:
                    await pending
                pending = loop.run_in_executor(None, f.write, chunk)
                total += len(chunk)
            if pending is not None:
                await pending
                pending = None
            ok = True
        finally:
            if pending is not None:
                await asyncio.gather(pending, return_exceptions=True)
            f.close()
            if not ok:
                try:
                    os.unlink(local_path)
                except OSError:
                    pass
        return total

    async def list(self, path: str = "/") -> List[FileStat]:
        """The entries of the directory at ``path`` (names are base names)."""
        resp = await self._http.request("GET", self._path + "/list", params={"path": path}, retry=True)
        return [FileStat.from_json(e) for e in resp.json().get("entries", [])]

    async def stat(self, path: str) -> FileStat:
        """The :class:`FileStat` of ``path`` (symlinks are not followed)."""
        resp = await self._http.request("GET", self._path + "/stat", params={"path": path}, retry=True)
        return FileStat.from_json(resp.json())

    async def exists(self, path: str) -> bool:
        """True when ``path`` exists in the sandbox."""
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def remove(self, path: str, recursive: bool = False, *, step: Optional[int] = None) -> None:
        """Removes a file, or with ``recursive=True`` a directory tree. ``step``: see
        :meth:`AsyncSandbox.exec`."""
        params = _step_params({"path": path, "recursive": "true" if recursive else "false"}, step)
        await self._http.request("DELETE", self._path, params=params, retry=True)

    async def mkdir(
        self, path: str, parents: bool = False, mode: Optional[int] = None, *, step: Optional[int] = None
    ) -> None:
        """Creates a directory; ``parents=True`` also creates missing parents (and accepts an existing one).
        ``step``: see :meth:`AsyncSandbox.exec`."""
        body: Dict[str, Any] = {"path": path, "parents": bool(parents)}
        if mode is not None:
            body["mode"] = int(mode)
        await self._http.request(
            "POST", self._path + "/mkdir", json=body, params=_step_params({}, step), retry=step is not None
        )

    async def chmod(self, path: str, mode: int, *, step: Optional[int] = None) -> None:
        """Sets the permission bits of ``path`` (e.g. ``0o755``). ``step``: see :meth:`AsyncSandbox.exec`."""
        await self._http.request(
            "POST",
            self._path + "/chmod",
            json={"path": path, "mode": int(mode)},
            params=_step_params({}, step),
            retry=step is not None,
        )


async def _aiter_file(f: IO[bytes], close: bool = False, chunk_size: int = _CHUNK) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    # The next read runs while the current chunk is being sent.
    fut = loop.run_in_executor(None, f.read, chunk_size)
    try:
        while True:
            chunk = await fut
            if not chunk:
                return
            fut = loop.run_in_executor(None, f.read, chunk_size)
            yield chunk
    finally:
        if not fut.done():
            await asyncio.gather(fut, return_exceptions=True)
        if close:
            f.close()


class AsyncPty:
    """An interactive terminal in a sandbox, over the node's WebSocket route.

    Bytes written with :meth:`send` reach the program's terminal; :meth:`recv` returns what it
    prints. When the program ends, :meth:`recv` returns ``b""`` and :attr:`exit_code` /
    :attr:`signal` are set. Use it as an async context manager, or call :meth:`close`.
    """

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._closed = False
        #: Exit status of the program once it has exited normally.
        self.exit_code: Optional[int] = None
        #: Signal number once the program was killed by a signal.
        self.signal: Optional[int] = None
        #: True once the terminal has ended (exit frame seen or socket closed).
        self.exited = False

    async def send(self, data: Union[bytes, str]) -> None:
        """Writes ``data`` (text is encoded as UTF-8) to the terminal's input."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        await self._ws.send(bytes(data))

    async def resize(self, cols: int, rows: int) -> None:
        """Changes the terminal's window size."""
        await self._ws.send(_json.dumps({"type": "resize", "cols": int(cols), "rows": int(rows)}))

    async def recv(self, timeout: Optional[float] = None) -> bytes:
        """Returns the next bytes the program printed, or ``b""`` once it has exited.

        Raises :class:`~warren.Timeout` when nothing arrives within ``timeout`` seconds.
        """
        from websockets.exceptions import ConnectionClosed

        while True:
            if self.exited:
                return b""
            try:
                if timeout is None:
                    msg = await self._ws.recv()
                else:
                    msg = await asyncio.wait_for(self._ws.recv(), timeout)
            except asyncio.TimeoutError:
                raise Timeout(f"no terminal output within {timeout} s") from None
            except ConnectionClosed:
                self.exited = True
                return b""
            if isinstance(msg, (bytes, bytearray, memoryview)):
                return bytes(msg)
            try:
                frame = _json.loads(msg)
            except ValueError:
                continue
            if frame.get("type") == "exit":
                self.exit_code = frame.get("exit_code")
                self.signal = frame.get("signal")
                self.exited = True
                return b""
            if frame.get("type") == "error":
                self.exited = True
                raise error_from_body(None, {"error": frame.get("error") or {}})

    async def read_until(self, marker: Union[bytes, str], timeout: Optional[float] = 10.0) -> bytes:
        """Reads until ``marker`` appears in the output; returns everything read so far."""
        if isinstance(marker, str):
            marker = marker.encode("utf-8")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        buf = b""
        while marker not in buf:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            chunk = await self.recv(timeout=left)
            if not chunk:
                break
            buf += chunk
        return buf

    async def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Reads (and drops) output until the program exits; returns its exit status."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while await self.recv(None if deadline is None else max(0.0, deadline - loop.time())):
            pass
        return self.exit_code

    def __aiter__(self) -> AsyncPty:
        return self

    async def __anext__(self) -> bytes:
        data = await self.recv()
        if not data:
            raise StopAsyncIteration
        return data

    async def close(self) -> None:
        """Closes the terminal; a program still running is ended."""
        if not self._closed:
            self._closed = True
            await self._ws.close()

    async def __aenter__(self) -> AsyncPty:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSandbox:
    """One sandbox. Made by :meth:`AsyncClient.create`, :meth:`AsyncClient.get` or
    :meth:`AsyncClient.list`; every call goes to the node that holds it.

    ``async with`` deletes the sandbox when the block ends.

    Attributes:
        id: The sandbox id (``<node>-<ulid>``).
        info: The last :class:`SandboxInfo` seen (see :meth:`refresh`).
        files: File calls (:class:`AsyncFiles`).
    """

    def __init__(self, client: AsyncClient, info: SandboxInfo) -> None:
        self._client = client
        self.id: str = info.id
        self.info: SandboxInfo = info
        self._path = f"/v1/sandboxes/{quote(info.id, safe='')}"
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state}>"

    @property
    def client(self) -> AsyncClient:
        """The client this sandbox talks through."""
        return self._client

    async def refresh(self) -> SandboxInfo:
        """Fetches the sandbox's current :class:`SandboxInfo` (also kept in :attr:`info`)."""
        resp = await self._client._http.request("GET", self._path, retry=True)
        self.info = SandboxInfo.from_json(resp.json())
        return self.info

    async def exec(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        user: Optional[str] = None,
        max_output: Optional[int] = None,
        check: bool = False,
        step: Optional[int] = None,
    ) -> ExecResult:
        """Runs a command to completion and returns its :class:`ExecResult`.

        Args:
            cmd: A string runs through ``/bin/sh -c``; a list is an argv run directly.
            timeout: Seconds; when exceeded the command's whole process tree is killed and the
                result has ``timed_out=True``. ``None``: no limit.
            cwd: Working directory (absolute); default the sandbox's workdir.
            env: Extra environment, over the sandbox's.
            stdin: Text (or UTF-8 bytes) fed to stdin, then closed.
            user: Run as this user (name or ``uid[:gid]``); default the sandbox's user.
            max_output: Cap per output stream in bytes (node default 1 MiB, at most 64 MiB);
                the rest is dropped and ``truncated`` is set.
            check: Raise :class:`~warren.CommandError` unless the command exits with status 0.
            step: The caller's step index in the sandbox's trajectory. The node runs a step at
                most once: a step already logged with the same request answers the recorded
                result (``replayed=True``) and runs nothing; one logged with a different
                request raises :class:`~warren.StepConflict`. Steps need not be contiguous but
                only go forward. See :meth:`trajectory_session`.

        Exec calls without a step are never retried: a command may have side effects. With a
        step, a call cut off by a connection failure is retried: the node answers the one run.
        """
        http = self._client._http
        body = _exec_body(cmd, cwd, env, stdin, user, timeout, max_output, step)
        if step is not None:
            resp = await http.request(
                "POST", self._path + "/exec", json=body, timeout=http.call_timeout(timeout), retry=True
            )
        else:
            resp = await http.request("POST", self._path + "/exec", json=body, timeout=http.call_timeout(timeout))
        result = ExecResult.from_json(resp.json())
        if check and (result.exit_code != 0 or result.timed_out):
            raise CommandError(cmd, result)
        return result

    def exec_stream(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Union[str, bytes, None] = None,
        user: Optional[str] = None,
        max_output: Optional[int] = None,
        check: bool = False,
        step: Optional[int] = None,
    ) -> AsyncExecStream:
        """Runs a command and streams its output as :class:`OutputChunk` s.

        Takes the arguments of :meth:`exec`. Not a coroutine: iterate the returned
        :class:`AsyncExecStream` (``async for chunk in sandbox.exec_stream(...)``), then read its
        ``result``; or ``await stream.wait()``. With ``check=True`` the end of the iteration
        raises :class:`~warren.CommandError` on a non-zero exit. With a ``step``, the command runs
        to its end even if the stream is closed early, and a replayed step streams its recorded
        output at once.
        """
        return AsyncExecStream(self, _exec_body(cmd, cwd, env, stdin, user, timeout, max_output, step), check)

    async def spawn(
        self,
        cmd: Command,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        max_output: Optional[int] = None,
        step: Optional[int] = None,
    ) -> AsyncProcess:
        """Starts a command in the background and returns its :class:`AsyncProcess`.

        The node keeps its output (up to ``max_output`` per stream) until :meth:`AsyncProcess.wait`.
        Background processes take no stdin.
        """
        body = _exec_body(cmd, cwd, env, None, user, timeout, max_output, step)
        resp = await self._client._http.request("POST", self._path + "/processes", json=body, retry=step is not None)
        info = ProcessInfo.from_json(resp.json())
        return AsyncProcess(self, info.pid, info.argv)

    def process(self, pid: int) -> AsyncProcess:
        """A handle on the background process ``pid`` (no call is made)."""
        return AsyncProcess(self, pid)

    async def processes(self) -> List[ProcessInfo]:
        """The sandbox's background processes, running and exited."""
        resp = await self._client._http.request("GET", self._path + "/processes", retry=True)
        return [ProcessInfo.from_json(p) for p in resp.json().get("processes", [])]

    async def pty(self, cmd: str = "/bin/bash", *, cols: int = 80, rows: int = 24) -> AsyncPty:
        """Opens an interactive terminal running ``cmd`` (a program, or a shell line when it has spaces).

        Needs the ``websockets`` package (``pip install 'warren[pty]'``).
        """
        try:
            from websockets.asyncio.client import connect, unix_connect
            from websockets.exceptions import InvalidStatus, WebSocketException
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError("Sandbox.pty needs the websockets package: pip install 'warren[pty]'") from e
        http = self._client._http
        query = urlencode({"cmd": cmd, "cols": int(cols), "rows": int(rows)})
        path = f"{self._path}/pty?{query}"
        kwargs: Dict[str, Any] = dict(
            max_size=None,
            open_timeout=30,
            ping_interval=None,
            compression=None,
            user_agent_header=f"warren-python/{_VERSION}",
        )
        try:
            if http.uds:
                ws = await unix_connect(http.uds, uri="ws://warren" + path, **kwargs)
            else:
                base = http.base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
                ws = await connect(base + path, **kwargs)
        except InvalidStatus as e:
            r = e.response
            try:
                body: Any = _json.loads(bytes(r.body or b""))
            except ValueError:
                body = bytes(r.body or b"").decode("utf-8", "replace")
            raise error_from_body(r.status_code, body, r.headers.get("Retry-After")) from None
        except (OSError, WebSocketException, asyncio.TimeoutError) as e:
            raise ConnectionError(f"terminal: {type(e).__name__}: {e}") from e
        return AsyncPty(ws)

    async def _feature(self, name: str, body: Any = None) -> Any:
        try:
            resp = await self._client._http.request(
                "POST", f"{self._path}/{name}", json=body, timeout=self._client._http.call_timeout(300)
            )
        except NotFound as e:
            if e.message.startswith("no route"):
                raise Unsupported(
                    f"this node does not serve {name} yet ({e.message})", code=e.code, status=e.status
                ) from None
            raise
        except WarrenError as e:
            if e.status == 405:
                raise Unsupported(
                    f"this node does not serve {name} yet ({e.message})", code=e.code, status=e.status
                ) from None
            raise
        if resp.status_code == 204 or not resp.content:
            return None
        return resp.json()

    def _update(self, data: Any) -> None:
        if isinstance(data, dict) and "id" in data and data.get("id") == self.id:
            self.info = SandboxInfo.from_json(data)

    async def pause(self) -> Optional[Dict[str, Any]]:
        """Pauses the sandbox: its processes are frozen and its memory is pushed out of RAM as
        far as the host allows. Any later call that needs the sandbox resumes it. Returns the
        node's pause stats (``memory_before_bytes``, ``memory_after_bytes``, ``duration_ms``,
        ``note``).

        Raises :class:`~warren.Unsupported` on nodes or substrates that cannot pause.
        """
        stats: Optional[Dict[str, Any]] = await self._feature("pause")
        self._update(stats)
        if isinstance(stats, dict) and "id" not in stats:
            await self.refresh()
        return stats

    async def resume(self) -> None:
        """Resumes a paused sandbox. Raises :class:`~warren.Unsupported` where not served yet."""
        self._update(await self._feature("resume"))

    async def fork(self, n: int = 1, labels: Optional[Mapping[str, str]] = None) -> List[AsyncSandbox]:
        """Makes ``n`` (1-64) new sandboxes with a copy of this one's files (running or paused;
        processes are not copied) and returns them. They carry this sandbox's labels merged with
        ``labels``; each one's trajectory starts with a ``forked_from`` entry naming this sandbox.

        Raises :class:`~warren.Unsupported` on nodes that do not serve forking yet.
        """
        body: Dict[str, Any] = {"n": int(n)}
        if labels:
            body["labels"] = dict(labels)
        data = await self._feature("fork", body)
        if isinstance(data, dict):
            items = data.get("sandboxes", [data] if "id" in data else [])
        else:
            items = data or []
        return [AsyncSandbox(self._client, SandboxInfo.from_json(d)) for d in items]

    async def trajectory(self, from_seq: Optional[int] = None) -> List[Dict[str, Any]]:
        """The sandbox's trajectory: one dict per call that changed it (exec, spawn, kill, file
        writes, mkdir, remove, chmod, fork), oldest first, as the node logged them (``seq``,
        ``step``, ``kind``, ``request``, ``request_sha256``, ``result``, ``error``, times). Does not
        resume a paused sandbox."""
        params = {} if from_seq is None else {"from_seq": str(int(from_seq))}
        resp = await self._client._http.request(
            "GET", self._path + "/trajectory", params=params, retry=True, timeout=self._client._http.call_timeout(None)
        )
        return [_json.loads(line) for line in resp.text.splitlines() if line.strip()]

    def trajectory_session(self, start: int = 0) -> AsyncTrajectory:
        """A :class:`AsyncTrajectory` that numbers this sandbox's calls as steps from ``start``."""
        return AsyncTrajectory(self, start)

    async def snapshot(self) -> Dict[str, Any]:
        """Snapshots the sandbox and returns the node's description of the snapshot.

        Raises :class:`~warren.Unsupported` on nodes that do not serve snapshots yet.
        """
        data = await self._feature("snapshot")
        return data if isinstance(data, dict) else {"result": data}

    async def network(self) -> Dict[str, Any]:
        """The sandbox's network policy and link: ``{"policy", "address", "gateway"}``
        (address and gateway are ``None`` with policy ``"none"``)."""
        resp = await self._client._http.request("GET", self._path + "/network", retry=True)
        data: Dict[str, Any] = resp.json()
        return data

    async def set_network(
        self,
        policy: Union[str, Mapping[str, Any], None] = None,
        *,
        allow: Optional[Sequence[Union[str, Mapping[str, Any]]]] = None,
        services: Optional[Mapping[str, bool]] = None,
        domains: Optional[Sequence[str]] = None,
    ) -> Dict[str, Any]:
        """Replaces the sandbox's network policy; new connections follow it at once.

        ``set_network("none")`` (or no argument) leaves loopback only;
        ``set_network(allow=["10.254.1.0/24:443:tcp"], services={"pypi": True},
        domains=["files.example.test"])`` opens exactly that (see :func:`network_policy`).
        Returns the same as :meth:`network`. Unknown services raise
        :class:`~warren.InvalidRequest`."""
        body = network_policy(policy, allow=allow, services=services, domains=domains)
        if isinstance(body, str):
            # Request bodies are JSON objects: "none" in its object form.
            body = {"mode": body}
        resp = await self._client._http.request("PUT", self._path + "/network", json=body, retry=True)
        data: Dict[str, Any] = resp.json()
        self.info.network = data.get("policy", body) if not _is_none_policy(data.get("policy")) else "none"
        return data

    async def delete(self, missing_ok: bool = True) -> None:
        """Deletes the sandbox and frees all it held. A sandbox already gone is fine
        unless ``missing_ok=False``."""
        try:
            await self._client._http.request("DELETE", self._path, retry=True)
        except NotFound:
            if not missing_ok:
                raise

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.delete()


class AsyncTrajectory:
    """Numbers one sandbox's calls as trajectory steps, so a rollout can be replayed after a
    crash: made by :meth:`AsyncSandbox.trajectory_session`.

    Each call takes the next step (``start``, ``start + 1``, ...). A process that restarts makes
    a new session with the same ``start`` and issues the same calls again: the steps already
    logged answer their recorded results without running (``replayed``), and the rollout goes
    on from where it stopped. A call that differs from what was logged at its step raises
    :class:`~warren.StepConflict`. A call cut off by a connection failure is retried with the
    same step; a call the node answered (result or error) moves to the next step.

    Attributes:
        sandbox: The sandbox the calls go to.
        step: The step the next call will take.
    """

    def __init__(self, sandbox: AsyncSandbox, start: int = 0) -> None:
        if start < 0:
            raise ValueError("start must be >= 0")
        self.sandbox = sandbox
        self.step = int(start)

    def __repr__(self) -> str:
        return f"<Trajectory {self.sandbox.id} next step {self.step}>"

    async def _run(self, call: Callable[[int], Awaitable[T]]) -> T:
        attempt = 0
        while True:
            try:
                out = await call(self.step)
            except ConnectionError:
                if attempt >= self.sandbox._client._http.max_retries:
                    raise
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            except WarrenError:
                self.step += 1
                raise
            self.step += 1
            return out

    def skip(self, n: int = 1) -> None:
        """Leaves ``n`` steps unused (steps need not be contiguous)."""
        self.step += int(n)

    async def exec(self, cmd: Command, **kwargs: Any) -> ExecResult:
        """:meth:`AsyncSandbox.exec` at the next step."""
        return await self._run(lambda s: self.sandbox.exec(cmd, step=s, **kwargs))

    async def spawn(self, cmd: Command, **kwargs: Any) -> AsyncProcess:
        """:meth:`AsyncSandbox.spawn` at the next step."""
        return await self._run(lambda s: self.sandbox.spawn(cmd, step=s, **kwargs))

    async def write(
        self, path: str, data: Union[bytes, bytearray, memoryview, str], mode: Optional[int] = None
    ) -> None:
        """:meth:`AsyncFiles.write` at the next step (bytes or text: a retry sends them again)."""
        await self._run(lambda s: self.sandbox.files.write(path, data, mode, step=s))

    async def mkdir(self, path: str, parents: bool = False, mode: Optional[int] = None) -> None:
        """:meth:`AsyncFiles.mkdir` at the next step."""
        await self._run(lambda s: self.sandbox.files.mkdir(path, parents, mode, step=s))

    async def remove(self, path: str, recursive: bool = False) -> None:
        """:meth:`AsyncFiles.remove` at the next step."""
        await self._run(lambda s: self.sandbox.files.remove(path, recursive, step=s))

    async def chmod(self, path: str, mode: int) -> None:
        """:meth:`AsyncFiles.chmod` at the next step."""
        await self._run(lambda s: self.sandbox.files.chmod(path, mode, step=s))


class AsyncClient:
    """The asyncio client of one Warren node, or of the gateways of a cluster.

    Args:
        url: ``unix:///path/to/warren.sock`` or ``http://host:port``, or several (a list, or
            one string with commas) -- the gateways of a cluster. Default: the
            ``WARREN_URL`` environment variable (which may list several), else
            ``unix:///run/warren/warren.sock``. Calls go to the URL that answered last; a
            request that could not be sent goes to the next URL, and calls that are safe to
            repeat also move on after a broken connection or a ``503``.
        timeout: Seconds an ordinary call may take (exec and waits use their own timeouts).
        max_connections: Size of the connection pool; each concurrent call holds one
            connection, so this is how many calls run at once (more wait their turn).
        max_retries: Waits before trying again, for safe calls (reads, deletes, creates with
            an idempotency key) after transport failures, ``503`` on every URL and ``busy``
            answers; each wait is the server's ``Retry-After`` (at most 30 s) or a backoff.

    One client serves thousands of concurrent calls from one event loop. Use it from the loop
    it was first used on; ``async with`` closes it.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str], None] = None,
        *,
        timeout: float = 120.0,
        max_connections: int = 4096,
        max_retries: int = 5,
    ) -> None:
        self._http = _Http(url, timeout, max_connections, max_retries)

    @property
    def url(self) -> str:
        """The address calls go to first (``unix:///...`` or ``http://...``): the one that
        answered last."""
        return self._http.url

    @property
    def urls(self) -> List[str]:
        """Every address of this client, in the order given."""
        return self._http.urls

    def __repr__(self) -> str:
        return f"<AsyncClient {self.url}>"

    async def health(self) -> Health:
        """The node's :class:`Health`: its id, version and the substrates it serves."""
        resp = await self._http.request("GET", "/v1/health", retry=True)
        return Health.from_json(resp.json())

    async def create(
        self,
        image: Union[str, Sequence[str]] = "default",
        *,
        substrate: str = "container",
        cpus: Optional[float] = None,
        memory: Union[int, str, None] = None,
        disk: Union[int, str, None] = None,
        pids: Optional[int] = None,
        cpu_class: Optional[str] = None,
        ttl: Union[int, float, datetime.timedelta, None] = None,
        idle_timeout: Union[int, float, datetime.timedelta, None] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        network: Union[str, Mapping[str, Any], None] = None,
        labels: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
        hostname: Optional[str] = None,
    ) -> AsyncSandbox:
        """Creates a sandbox and returns it once it runs.

        Args:
            image: An image name (``"default"``) or a stack of layer refs, lowest first.
            substrate: ``"container"``, ``"function"``, ``"microvm"`` or ``"vm"``; everything
                else stays the same. A substrate the node does not serve raises
                :class:`~warren.UnsupportedSubstrate`.
            cpus: CPU cores (fractions allowed).
            memory: MiB as an int, or a string like ``"512M"`` / ``"1G"``. The writable layer
                counts against it.
            disk: Size of the writable layer, like ``memory``.
            pids: Maximum processes and threads.
            cpu_class: ``"normal"`` (default) or ``"best_effort"``: lowest CPU weight and
                ``SCHED_IDLE``, so busy best-effort sandboxes do not starve normal ones.
            ttl: Hard lifetime (seconds or a timedelta); the sandbox is deleted when it expires.
            idle_timeout: Seconds without any call after which the sandbox is stopped.
            env: Environment of every command.
            workdir: Default working directory (absolute).
            user: Default user: a name from the image's /etc/passwd or ``uid[:gid]``.
            network: Network policy: ``"none"`` (the default: loopback only) or a policy dict
                (see :func:`network_policy` and :meth:`AsyncSandbox.set_network`).
            labels: Key/value labels, for :meth:`list` and :meth:`delete_all`.
            idempotency_key: A repeated create with the same key returns the first sandbox;
                with a key, the create is retried on transport failures.
            hostname: The sandbox's host name.
        """
        body: Dict[str, Any] = {
            "substrate": substrate,
            "image": image if isinstance(image, str) else list(image),
        }
        if cpus is not None:
            body["cpus"] = float(cpus)
        mem = parse_mib(memory, "memory")
        if mem is not None:
            body["memory_mb"] = mem
        dsk = parse_mib(disk, "disk")
        if dsk is not None:
            body["disk_mb"] = dsk
        if pids is not None:
            body["pids"] = int(pids)
        if cpu_class is not None:
            body["cpu_class"] = cpu_class
        t = _secs(ttl, "ttl")
        if t is not None:
            body["ttl_secs"] = t
        t = _secs(idle_timeout, "idle_timeout")
        if t is not None:
            body["idle_timeout_secs"] = t
        if env:
            body["env"] = dict(env)
        if workdir is not None:
            body["workdir"] = workdir
        if user is not None:
            body["user"] = user
        if network is not None:
            body["network"] = network if isinstance(network, str) else dict(network)
        if labels:
            body["labels"] = dict(labels)
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        if hostname is not None:
            body["hostname"] = hostname
        resp = await self._http.request("POST", "/v1/sandboxes", json=body, retry=idempotency_key is not None)
        return AsyncSandbox(self, SandboxInfo.from_json(resp.json()))

    async def call(
        self,
        image: Union[str, Sequence[str]],
        cmd: Command,
        *,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        limits: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        return_files: Optional[Sequence[str]] = None,
        interpreter: Optional[str] = None,
        preload: Optional[Sequence[str]] = None,
        max_output: Optional[int] = None,
        check: bool = False,
    ) -> CallResult:
        """Runs one stateless command in a warm container of ``image`` and returns its
        :class:`CallResult`.

        Every call starts from the image as built: nothing of an earlier call (files,
        processes, environment) is visible, and everything the call started is killed when
        its command ends.

        Args:
            image: An image name or a stack of layer refs, lowest first.
            cmd: A string runs through ``/bin/sh -c``; a list is an argv run directly.
            files: Path to contents (text or bytes) written before the command starts.
            stdin: Text (or UTF-8 bytes) fed to stdin, then closed.
            timeout: Seconds; when exceeded everything the call started is killed.
            limits: ``cpus``, ``memory`` and ``disk`` (MiB or ``"512M"``), ``pids`` of the
                pool's containers; calls with the same image, limits and interpreter share a pool.
            env: Environment of the command.
            cwd: Working directory (absolute).
            return_files: Paths read back after the command ended (``result.files``).
            interpreter: Keep this Python interpreter (``"python3"``) started in the pool's
                warm environments; calls ``[python3, "-c", code, ...]`` or
                ``[python3, script, ...]`` are handed to it.
            preload: Modules the warm interpreter imports ahead of the call.
            max_output: Cap per output stream in bytes.
            check: Raise :class:`~warren.CommandError` unless the command exits with status 0.

        A saturated pool answers ``busy``; the call is retried after the node's
        ``retry_after`` (calls are stateless), up to ``max_retries`` times.
        """
        body = call_body(
            image,
            cmd,
            files=files,
            stdin=stdin,
            timeout=timeout,
            limits=limits,
            env=env,
            cwd=cwd,
            return_files=return_files,
            interpreter=interpreter,
            preload=preload,
            max_output=max_output,
            parse_mib=parse_mib,
        )
        resp = await self._http.request(
            "POST", "/v1/functions/call", json=body, timeout=self._http.call_timeout(timeout), retry=True
        )
        result = CallResult.from_json(resp.json())
        if check and not result.ok:
            raise CommandError(cmd, result)  # type: ignore[arg-type]
        return result

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """Reconnects to the sandbox ``sandbox_id``, made by this or any other process."""
        resp = await self._http.request("GET", f"/v1/sandboxes/{quote(sandbox_id, safe='')}", retry=True)
        return AsyncSandbox(self, SandboxInfo.from_json(resp.json()))

    async def list(self, labels: Optional[Mapping[str, str]] = None, state: Optional[str] = None) -> List[AsyncSandbox]:
        """The node's sandboxes (oldest first) that carry every label in ``labels`` and, when
        given, are in ``state`` (``"running"``, ``"stopped"``, ...)."""
        params: List[Tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if state is not None:
            params.append(("state", state))
        resp = await self._http.request("GET", "/v1/sandboxes", params=params, retry=True)
        return [AsyncSandbox(self, SandboxInfo.from_json(d)) for d in resp.json().get("sandboxes", [])]

    async def images(self) -> List[Dict[str, Any]]:
        """The node's images (``GET /v1/images``): dicts with ``reference``, ``layers`` (each
        with ``digest``, ``size_bytes``, ``source``, ...), ``stack``, ``size_bytes``."""
        resp = await self._http.request("GET", "/v1/images", retry=True)
        return list(resp.json().get("images", []))

    async def image(self, reference: str) -> Dict[str, Any]:
        """One image (``name[:tag]``) with its layers; :class:`NotFound` if there is none."""
        resp = await self._http.request("GET", f"/v1/images/{quote(reference, safe='')}", retry=True)
        return dict(resp.json())

    async def delete_image(self, reference: str) -> Dict[str, Any]:
        """Removes an image tag and collects the layers nothing else (no other image, no live
        sandbox) uses; returns ``{"reference", "gc": {"removed", "freed_bytes", "in_use"}}``."""
        resp = await self._http.request("DELETE", f"/v1/images/{quote(reference, safe='')}")
        return dict(resp.json())

    async def gc_images(self) -> Dict[str, Any]:
        """Collects every layer no image and no live sandbox references."""
        resp = await self._http.request("POST", "/v1/images/gc")
        return dict(resp.json())

    async def cluster(self) -> Dict[str, Any]:
        """The cluster as a gateway sees it (``GET /v1/cluster``, gateways only): ``nodes``
        (each with ``id``, ``address``, ``state`` -- ``ready``, ``draining`` or ``lost`` --,
        substrates, capacity and load), ``etcd_connected`` and ``revision``."""
        resp = await self._http.request("GET", "/v1/cluster", retry=True)
        return dict(resp.json())

    async def drain(self, node: str) -> None:
        """Takes no new sandboxes on ``node``; its sandboxes keep running (gateways only)."""
        await self._http.request("POST", f"/v1/cluster/nodes/{quote(node, safe='')}/drain", retry=True)

    async def undrain(self, node: str) -> None:
        """Lets ``node`` take new sandboxes again (gateways only)."""
        await self._http.request("POST", f"/v1/cluster/nodes/{quote(node, safe='')}/undrain", retry=True)

    async def delete_all(
        self, labels: Optional[Mapping[str, str]] = None, state: Optional[str] = None, concurrency: int = 64
    ) -> int:
        """Deletes every sandbox :meth:`list` finds with these filters; returns how many.

        Without ``labels`` or ``state`` this deletes every sandbox on the node.
        """
        boxes = await self.list(labels=labels, state=state)
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(sb: AsyncSandbox) -> None:
            async with sem:
                await sb.delete()

        await asyncio.gather(*(one(sb) for sb in boxes))
        return len(boxes)

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
