"""Files of a sandbox: read, write, upload, download, list, stat, mkdir, remove, chmod."""

from __future__ import annotations

import asyncio
import os
from typing import IO, TYPE_CHECKING, Any, AsyncGenerator, AsyncIterable, AsyncIterator, Dict, List, Optional, Union

import httpx

from ._errors import NotFound
from ._models import FileStat
from ._transport import _CHUNK, _step_params, _transport_error

if TYPE_CHECKING:
    from ._sandboxes import AsyncSandbox
    from ._transport import _Http


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
