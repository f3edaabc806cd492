"""Interactive terminals over the node's WebSocket route."""

from __future__ import annotations

import asyncio
import json as _json
from typing import Any, Optional, Union

from ._errors import Timeout, error_from_body


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
