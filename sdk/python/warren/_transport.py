"""The transport: where a node is, one HTTP connection pool to it (unix socket or TCP),
retries with backoff, and API errors turned into exceptions."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, Dict, Optional, Tuple, TypeVar
from urllib.parse import urlsplit

import httpx

from ._errors import Busy, ConnectionError, Timeout, WarrenError, error_from_body
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
        raise ValueError(f"url must be unix:///path.sock or http://host:port, got {url!r}")
    return url.rstrip("/"), None


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


class _Http:
    """The pooled HTTP connection to one node, with the retry policy for safe calls."""

    def __init__(
        self,
        url: Optional[str],
        timeout: float,
        max_connections: int,
        max_retries: int,
    ) -> None:
        self.base_url, self.uds = _parse_url(url)
        self.url = f"unix://{self.uds}" if self.uds else self.base_url
        self.max_retries = max_retries
        self.timeout = httpx.Timeout(connect=10.0, read=timeout, write=timeout, pool=None)
        # httpx's own pool costs O(open connections) per call; ours is O(1) at any size.
        transport = PoolTransport(self.uds, max_connections=max_connections, keepalive_expiry=30.0)
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            transport=transport,
            timeout=self.timeout,
            headers={"user-agent": f"warren-python/{_VERSION}"},
        )
        _raise_fd_limit(max_connections + 1024)

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

        With ``retry``, transport failures and ``busy`` answers are retried with exponential
        backoff and jitter, honouring the node's ``retry_after``.
        """
        attempt = 0
        while True:
            try:
                resp = await self.client.request(
                    method,
                    path,
                    json=json,
                    params=params,
                    content=content,
                    timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
                )
            except httpx.TransportError as e:
                err = _transport_error(e, f"{method} {path}")
                if not retry or attempt >= self.max_retries or isinstance(e, httpx.ReadTimeout):
                    raise err from e
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            if resp.status_code < 400:
                return resp
            try:
                _raise_for(resp)
            except WarrenError as err:
                retryable = isinstance(err, Busy) or (resp.status_code == 429 and err.retry_after is not None)
                if not retry or not retryable or attempt >= self.max_retries:
                    raise
                delay = _backoff(attempt)
                if err.retry_after is not None:
                    delay = max(delay, err.retry_after)
                await asyncio.sleep(delay)
                attempt += 1

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
        attempt = 0
        while True:
            req = self.client.build_request(
                method,
                path,
                json=json,
                params=params,
                content=content,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
            try:
                resp = await self.client.send(req, stream=True)
            except httpx.TransportError as e:
                err = _transport_error(e, f"{method} {path}")
                if not retry or attempt >= self.max_retries:
                    raise err from e
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
                continue
            if resp.status_code < 400:
                return resp
            try:
                await resp.aread()
            finally:
                await resp.aclose()
            try:
                _raise_for(resp)
            except WarrenError as err:
                if not retry or not isinstance(err, Busy) or attempt >= self.max_retries:
                    raise
                await asyncio.sleep(max(_backoff(attempt), err.retry_after or 0))
                attempt += 1
