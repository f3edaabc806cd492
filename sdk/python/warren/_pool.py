"""An httpx transport with a connection pool that stays O(1) per call at thousands of
concurrent calls.

httpx's default pool rescans every connection (and, for each idle one, every connection
again) whenever a request starts or ends, which costs milliseconds of CPU per call once a
few hundred connections are open. This pool keeps idle HTTP/1.1 connections on a stack and
hands them out in constant time; a semaphore bounds how many are open.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, AsyncIterator, List, Optional

import httpcore
import httpx

__all__ = ["PoolTransport"]


def _map_error(e: Exception) -> Exception:
    """httpcore's exceptions as httpx's exceptions of the same name."""
    cls = getattr(httpx, type(e).__name__, None)
    if isinstance(cls, type) and issubclass(cls, httpx.TransportError):
        return cls(str(e))
    return httpx.TransportError(f"{type(e).__name__}: {e}")


class _ResponseStream(httpx.AsyncByteStream):
    def __init__(self, stream: Any, pool: PoolTransport, conn: httpcore.AsyncHTTPConnection) -> None:
        self._stream = stream
        self._pool = pool
        self._conn: Optional[httpcore.AsyncHTTPConnection] = conn

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except httpcore.TimeoutException as e:
            raise _map_error(e) from e
        except (httpcore.NetworkError, httpcore.ProtocolError) as e:
            raise _map_error(e) from e

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await self._stream.aclose()
        except BaseException:
            await self._pool._discard(conn)
            raise
        await self._pool._release(conn)


class PoolTransport(httpx.AsyncBaseTransport):
    """A transport to one node (a Unix socket or one host:port) with a constant-time pool.

    Args:
        uds: Path of the node's Unix socket, or ``None`` for TCP.
        max_connections: Most connections open at once; more calls wait their turn.
        keepalive_expiry: Seconds an idle connection is kept.
        verify: TLS verification for ``https`` URLs (as in httpx).
    """

    def __init__(
        self,
        uds: Optional[str] = None,
        max_connections: int = 4096,
        keepalive_expiry: float = 30.0,
        verify: Any = True,
    ) -> None:
        self._uds = uds
        self._max = max(1, int(max_connections))
        self._expiry = keepalive_expiry
        self._verify = verify
        self._ssl: Optional[ssl.SSLContext] = None
        self._idle: List[httpcore.AsyncHTTPConnection] = []
        self._sem: Optional[asyncio.Semaphore] = None
        self._closed = False

    def _origin(self, url: httpx.URL) -> httpcore.Origin:
        port = url.port or (443 if url.scheme == "https" else 80)
        return httpcore.Origin(url.raw_scheme, url.raw_host, port)

    async def _acquire(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        if self._sem is None:  # made here so it belongs to the running loop
            self._sem = asyncio.Semaphore(self._max)
        await self._sem.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if conn.is_idle() and not conn.has_expired() and conn.can_handle_request(origin):
                    return conn
                await conn.aclose()
            if origin.scheme == b"https" and self._ssl is None:
                self._ssl = httpx.create_ssl_context(verify=self._verify)
            return httpcore.AsyncHTTPConnection(
                origin=origin,
                ssl_context=self._ssl,
                keepalive_expiry=self._expiry,
                uds=self._uds,
                retries=0,
            )
        except BaseException:
            self._sem.release()
            raise

    async def _release(self, conn: httpcore.AsyncHTTPConnection) -> None:
        assert self._sem is not None
        self._sem.release()
        if conn.is_idle() and not self._closed:
            self._idle.append(conn)
        else:
            await conn.aclose()

    async def _discard(self, conn: httpcore.AsyncHTTPConnection) -> None:
        assert self._sem is not None
        self._sem.release()
        try:
            await conn.aclose()
        except BaseException:
            pass

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Sends ``request`` on a pooled connection; the connection returns to the pool when
        the response is closed."""
        if self._closed:
            raise httpx.ConnectError("the client is closed")
        origin = self._origin(request.url)
        conn = await self._acquire(origin)
        req = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            resp = await conn.handle_async_request(req)
        except BaseException as e:
            await self._discard(conn)
            if isinstance(e, (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError)):
                raise _map_error(e) from e
            raise
        return httpx.Response(
            status_code=resp.status,
            headers=resp.headers,
            stream=_ResponseStream(resp.stream, self, conn),
            extensions=resp.extensions,
        )

    async def aclose(self) -> None:
        """Closes every idle connection; connections in use close when their call ends."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            try:
                await conn.aclose()
            except Exception:
                pass
