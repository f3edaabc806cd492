"""The transport: where a node is, one HTTP connection pool to it (unix socket or TCP),
retries with backoff, and API errors turned into exceptions."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple, TypeVar, Union
from urllib.parse import urlsplit

import httpx

from ._errors import ConnectionError, Timeout, WarrenError, error_from_body
from ._failover import BROKEN, GIVE_UP, NEXT_URL, NOT_SENT, Plan, split_urls
from ._pool import PoolTransport

T = TypeVar("T")


#: Where the SDK looks for a node when neither ``url`` nor ``WARREN_URL`` says.
DEFAULT_URL = "unix:///run/warren/warren.sock"


_VERSION = "0.1.0"
_CHUNK = 1 << 20
# Extra seconds the HTTP call waits past a command's own timeout before giving up on the node.
_MARGIN = 30.0


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
        raise ValueError(f"url must be unix:///path.sock, http://host:port or https://host:port, got {url!r}")
    return url.rstrip("/"), None


def _step_params(params: Dict[str, Any], step: Optional[int]) -> Dict[str, Any]:
    if step is not None:
        params["step"] = str(int(step))
    return params


def _backoff(attempt: int, base: float = 0.05, cap: float = 5.0) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, base * (2**attempt)))


def _raise_for(resp: httpx.Response, node: Optional[str] = None, token: bool = False) -> None:
    try:
        body: Any = resp.json()
    except ValueError:
        body = resp.text
    err = error_from_body(resp.status_code, body, resp.headers.get("retry-after"))
    if resp.status_code == 401 and node:
        hint = "the token sent was refused" if token else "no token was sent; pass token= or set WARREN_TOKEN"
        err.message = f"{err.message} ({hint}; warrend at {node})"
        err.args = (err.message,)
    raise err


def _transport_error(e: Exception, what: str, node: Optional[str] = None) -> WarrenError:
    if isinstance(e, httpx.TimeoutException):
        return Timeout(f"{what}: the HTTP call timed out ({type(e).__name__})", code="timeout")
    text = str(e)
    if node and node.startswith("https://") and ("SSL" in text or "CERTIFICATE" in text or "TLSV1" in text):
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text.lower():
            why = "the node's certificate is not trusted (pass ca= or set WARREN_CA to the CA that signed it)"
        else:
            why = "the TLS handshake failed (the node may require a client certificate)"
        return ConnectionError(f"{what}: TLS with {node} failed: {why} [{type(e).__name__}: {text}]")
    return ConnectionError(f"{what}: {type(e).__name__}: {e}")


#: Seconds a call waits for a node that does not answer (a restarting daemon), by default.
DEFAULT_RESTART_WAIT = 30.0


def _restart_wait(given: Optional[float]) -> float:
    """``restart_wait`` as given, else ``WARREN_RESTART_WAIT``, else the default."""
    if given is None:
        env = (os.environ.get("WARREN_RESTART_WAIT") or "").strip()
        if not env:
            return DEFAULT_RESTART_WAIT
        try:
            given = float(env)
        except ValueError:
            raise ValueError(f"WARREN_RESTART_WAIT must be a number of seconds, got {env!r}") from None
    given = float(given)
    if not given >= 0:
        raise ValueError(f"restart_wait must be >= 0 seconds, got {given!r}")
    return given


def _outlasted(err: WarrenError, plan: Plan) -> WarrenError:
    """``err``, saying so when the call gave up because the node stayed silent for the
    whole ``restart_wait``."""
    if plan.outlasted:
        err.message = (
            f"{err.message} (the node did not answer for {plan.restart_wait:g} s, the client's "
            "restart_wait; pass a larger restart_wait= or set WARREN_RESTART_WAIT to wait longer)"
        )
        err.args = (err.message,)
    return err


def _tls_context(ca: Optional[str]) -> Any:
    """The TLS verification of ``https`` URLs: the CA file ``ca`` (else ``WARREN_CA``), else the system's."""
    ca = ca or os.environ.get("WARREN_CA") or None
    if ca is None:
        return True
    import ssl

    return ssl.create_default_context(cafile=os.fspath(ca))


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

    def __init__(
        self,
        url: Optional[str],
        timeout: httpx.Timeout,
        max_connections: int,
        headers: Dict[str, str],
        ca: Optional[str] = None,
    ) -> None:
        self.base_url, self.uds = _parse_url(url)
        self.url = f"unix://{self.uds}" if self.uds else self.base_url
        self.verify = _tls_context(ca) if self.base_url.startswith("https://") else True
        # httpx's own pool costs O(open connections) per call; ours is O(1) at any size.
        transport = PoolTransport(
            self.uds, max_connections=max_connections, keepalive_expiry=30.0, verify=self.verify
        )
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=timeout,
            headers=headers,
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
        token: Optional[str] = None,
        ca: Optional[str] = None,
        restart_wait: Optional[float] = None,
    ) -> None:
        self.max_retries = max_retries
        self.restart_wait = _restart_wait(restart_wait)
        self.timeout = httpx.Timeout(connect=10.0, read=timeout, write=timeout, pool=None)
        token = token if token is not None else (os.environ.get("WARREN_TOKEN") or "").strip() or None
        self.headers: Dict[str, str] = {"user-agent": f"warren-python/{_VERSION}"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self.has_token = bool(token)
        if isinstance(url, str) and "," not in url:
            urls: List[Optional[str]] = [url]
        elif url is None:
            env = os.environ.get("WARREN_URL")
            urls = split_urls(env) if env else [None]
        else:
            urls = split_urls(url)
        self.targets = [_Target(u, self.timeout, max_connections, self.headers, ca) for u in urls]
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
    def verify(self) -> Any:
        return self._current.verify

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
        plan = Plan(len(self.targets), self.max_retries, retry and replayable, self.restart_wait)
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
                err: WarrenError = _transport_error(e, f"{method} {path} at {target.url}", target.url)
                if isinstance(e, httpx.ReadTimeout) and not stream:
                    raise err from e
                not_sent = isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout))
                # An unsent request's body was not read, so even a stream may go elsewhere.
                step = plan.after(NOT_SENT if not_sent else BROKEN)
                if step == GIVE_UP:
                    raise _outlasted(err, plan) from e
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
                    _raise_for(resp, target.url, self.has_token)
                except WarrenError as e:
                    err = e
                step = plan.after((resp.status_code, err.retry_after, err.code))
                if step == GIVE_UP:
                    if idx != first:
                        self.preferred = idx  # it answered: later calls start with it
                    raise _outlasted(err, plan)
            if step == NEXT_URL:
                idx = (idx + 1) % len(self.targets)
            else:
                await asyncio.sleep(float(step))
                idx = self.preferred
