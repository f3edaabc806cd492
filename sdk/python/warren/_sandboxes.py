"""Sandboxes: one sandbox's handle (commands, files, terminals, lifecycle, network) and the
sizes, durations and network policies a create request is made of."""

from __future__ import annotations

import asyncio
import datetime
import json as _json
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import quote, urlencode

from ._errors import CommandError, ConnectionError, NotFound, Unsupported, WarrenError, error_from_body
from ._exec import AsyncExecStream, AsyncProcess, _exec_body
from ._files import AsyncFiles
from ._models import ExecResult, ProcessInfo, SandboxInfo
from ._pty import AsyncPty
from ._trajectory import AsyncTrajectory
from ._transport import _VERSION

if TYPE_CHECKING:
    from ._base import ClientRef
    from ._exec import Command


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


class AsyncSandbox:
    """One sandbox. Made by :meth:`AsyncClient.create`, :meth:`AsyncClient.get` or
    :meth:`AsyncClient.list`; every call goes to the node that holds it.

    ``async with`` deletes the sandbox when the block ends.

    Attributes:
        id: The sandbox id (``<node>-<ulid>``).
        info: The last :class:`SandboxInfo` seen (see :meth:`refresh`).
        files: File calls (:class:`AsyncFiles`).
    """

    def __init__(self, client: ClientRef, info: SandboxInfo) -> None:
        self._client = client
        self.id: str = info.id
        self.info: SandboxInfo = info
        self._path = f"/v1/sandboxes/{quote(info.id, safe='')}"
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.info.state}>"

    @property
    def client(self) -> ClientRef:
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
        kill_tree: bool = False,
        binary: bool = False,
    ) -> ExecResult:
        """Runs a command to completion and returns its :class:`ExecResult`.

        Args:
            cmd: A string runs through ``/bin/sh -c``; a list is an argv run directly.
            timeout: Seconds; when exceeded the command's whole process tree is killed and the
                result has ``timed_out=True``. ``None``: no limit.
            cwd: Working directory (absolute); default the sandbox's workdir.
            env: Extra environment, over the sandbox's.
            stdin: Text, or any bytes, fed to stdin, then closed (at most 16 MiB).
            user: Run as this user (name or ``uid[:gid]``); default the sandbox's user.
            max_output: Cap per output stream in bytes (node default 1 MiB, at most 64 MiB);
                the rest is dropped and ``truncated`` is set.
            check: Raise :class:`~warren.CommandError` unless the command exits with status 0.
            step: The caller's step index in the sandbox's trajectory. The node runs a step at
                most once: a step already logged with the same request answers the recorded
                result (``replayed=True``) and runs nothing; one logged with a different
                request raises :class:`~warren.StepConflict`. Steps need not be contiguous but
                only go forward. See :meth:`trajectory_session`.
            kill_tree: When the command ends, kill every process it started (background
                jobs, daemons, double forks), as a timeout does. Off by default: such
                processes keep running in the sandbox. Function calls always end everything.
            binary: Return ``stdout`` and ``stderr`` as the raw ``bytes`` the command wrote,
                not decoded as UTF-8.

        Exec calls without a step are never retried: a command may have side effects. With a
        step, a call cut off by a connection failure is retried: the node answers the one run.
        """
        http = self._client._http
        body = _exec_body(cmd, cwd, env, stdin, user, timeout, max_output, step, kill_tree)
        if binary:
            body["encoding"] = "base64"
        if step is not None:
            resp = await http.request(
                "POST", self._path + "/exec", json=body, timeout=http.call_timeout(timeout), retry=True
            )
        else:
            resp = await http.request("POST", self._path + "/exec", json=body, timeout=http.call_timeout(timeout))
        result = ExecResult.from_json(resp.json(), binary=binary)
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
        kill_tree: bool = False,
    ) -> AsyncExecStream:
        """Runs a command and streams its output as :class:`OutputChunk` s.

        Takes the arguments of :meth:`exec`. Not a coroutine: iterate the returned
        :class:`AsyncExecStream` (``async for chunk in sandbox.exec_stream(...)``), then read its
        ``result``; or ``await stream.wait()``. With ``check=True`` the end of the iteration
        raises :class:`~warren.CommandError` on a non-zero exit. With a ``step``, the command runs
        to its end even if the stream is closed early, and a replayed step streams its recorded
        output at once.
        """
        return AsyncExecStream(
            self, _exec_body(cmd, cwd, env, stdin, user, timeout, max_output, step, kill_tree), check
        )

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
        if "authorization" in http.headers:
            kwargs["additional_headers"] = {"Authorization": http.headers["authorization"]}
        try:
            if http.uds:
                ws = await unix_connect(http.uds, uri="ws://warren" + path, **kwargs)
            else:
                base = http.base_url.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
                if base.startswith("wss://") and not isinstance(http.verify, bool):
                    kwargs["ssl"] = http.verify
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

    async def _feature(self, name: str, body: Any = None, params: Optional[Dict[str, str]] = None) -> Any:
        try:
            resp = await self._client._http.request(
                "POST",
                f"{self._path}/{name}",
                json=body,
                params=params,
                timeout=self._client._http.call_timeout(300),
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

    async def extend(self, ttl: Union[int, float, datetime.timedelta]) -> None:
        """Gives the sandbox a new lifetime: it now expires ``ttl`` (seconds or a
        ``timedelta``) from now, within the node's maximum lifetime (``warrend --max-ttl``).
        ``info.expires_at_ms`` shows the new expiry."""
        secs = _secs(ttl, "ttl")
        resp = await self._client._http.request(
            "POST", self._path + "/extend", json={"ttl_secs": secs}, retry=True
        )
        self._update(resp.json())

    async def resume(self) -> None:
        """Resumes a paused sandbox. Raises :class:`~warren.Unsupported` where not served yet."""
        self._update(await self._feature("resume"))

    async def fork(
        self, n: int = 1, labels: Optional[Mapping[str, str]] = None, step: Optional[int] = None
    ) -> List[AsyncSandbox]:
        """Makes ``n`` (1-64) new sandboxes with a copy of this one's files (running or paused;
        processes are not copied) and returns them. They carry this sandbox's labels merged with
        ``labels``; each one's trajectory starts with a ``forked_from`` entry naming this sandbox.

        With ``step``, the fork runs once per step like ``exec``: asking the same step again
        (after a lost answer, a trainer restart) returns the children the first call made, and
        another request under that step, or a step below the last one, raises
        :class:`~warren.StepConflict`.

        Raises :class:`~warren.Unsupported` on nodes that do not serve forking yet.
        """
        body: Dict[str, Any] = {"n": int(n)}
        if labels:
            body["labels"] = dict(labels)
        params = None if step is None else {"step": str(int(step))}
        data = await self._feature("fork", body, params)
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

    async def snapshot(self, labels: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
        """Saves the sandbox (running or paused; it stays as it was) as a snapshot and returns
        it (``SnapshotInfo``: ``id``, ``sandbox``, ``sandbox_seq``, ``substrate``,
        ``processes``, ``size_bytes``, ...). A ``microvm``/``vm`` snapshot holds memory and
        processes, a ``container`` one its files. Start sandboxes from it with
        ``client.create(snapshot=info["id"])``; remove it with ``client.delete_snapshot``.

        Raises :class:`~warren.Unsupported` on nodes that do not serve snapshots yet.
        """
        body: Dict[str, Any] = {"labels": dict(labels)} if labels else {}
        data = await self._feature("snapshot", body)
        return data if isinstance(data, dict) else {"result": data}

    async def stats(self) -> Dict[str, Any]:
        """What the sandbox uses now, against its limits (``GET .../stats``): ``cpu_share``
        (of its CPU limit, over ``window_secs`` since the previous ``stats()``, or since it was
        created), ``memory_bytes``/``memory_peak_bytes``/``memory_limit_bytes``,
        ``disk_bytes``/``disk_limit_bytes`` (the writable layer), ``pids``/``pids_limit``,
        ``oom_kills``, ``trajectory_bytes``/``trajectory_budget_bytes`` and ``idle_secs``.
        Figures the substrate cannot read are ``None``. A paused sandbox stays paused."""
        resp = await self._client._http.request("GET", self._path + "/stats", retry=True)
        data: Dict[str, Any] = resp.json()
        return data

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

    def port_path(self, port: int, path: str = "/") -> str:
        """The API path that reaches ``path`` on the HTTP server listening on TCP ``port``
        inside the sandbox (``127.0.0.1:port`` as the sandbox sees it):
        ``/v1/sandboxes/<id>/ports/<port><path>``."""
        if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
            raise ValueError(f"port must be an integer 1-65535, got {port!r}")
        if not path.startswith("/"):
            path = "/" + path
        return f"{self._path}/ports/{port}{path}"

    def url(self, port: int, path: str = "/") -> str:
        """The URL of ``path`` on the HTTP server listening on ``port`` inside the sandbox,
        through this client's node or gateway. Requests to it need the client's token
        (``Authorization: Bearer``); the server never sees that header. A node reached over
        its Unix socket has no such URL for other programs: use :meth:`http`."""
        return self._client._http.base_url + self.port_path(port, path)

    async def http(
        self,
        port: int,
        path: str = "/",
        *,
        method: str = "GET",
        content: Any = None,
        json: Any = None,
        params: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = 60.0,
    ) -> Any:
        """Sends one HTTP request to the server listening on ``port`` inside the sandbox and
        returns its answer (an ``httpx.Response``, read whole), whatever its status (the
        server's answers carry a ``Warren-Port`` header). A paused sandbox is resumed first.
        Nothing listening raises :class:`~warren.PortUnreachable`; a sandbox that does not
        exist raises :class:`~warren.NotFound`."""
        http = self._client._http
        resp = await http.client.request(
            method,
            self.port_path(port, path),
            content=content,
            json=json,
            params=params,
            headers=dict(headers or {}),
            timeout=http.call_timeout(timeout),
        )
        # Answers of the server inside carry ``Warren-Port``; an error without it is Warren's
        # own (bad port, no such sandbox, nothing listening).
        if resp.status_code >= 400 and "warren-port" not in resp.headers:
            try:
                body: Any = resp.json()
            except ValueError:
                body = resp.text
            raise error_from_body(resp.status_code, body, resp.headers.get("Retry-After"))
        return resp

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
