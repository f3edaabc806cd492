"""Files of a sandbox: read, write, upload, download, list, stat, mkdir, remove, chmod."""

from __future__ import annotations

import asyncio
import io
import os
import queue as _queue
import tarfile
import threading
from typing import IO, TYPE_CHECKING, Any, AsyncGenerator, AsyncIterable, AsyncIterator, Dict, List, Optional, Tuple, Union

import httpx

from ._errors import NotFound
from ._models import FileStat
from ._transport import _CHUNK, _step_params, _transport_error

if TYPE_CHECKING:
    from ._base import SandboxRef
    from ._transport import _Http


class AsyncFiles:
    """File calls of one sandbox (``sandbox.files``). Paths are absolute inside the sandbox."""

    def __init__(self, sandbox: SandboxRef) -> None:
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

    async def upload_dir(self, local_dir: Union[str, os.PathLike[str]], remote_dir: str) -> None:
        """Copies the local directory ``local_dir``'s contents into ``remote_dir`` (made when
        missing), streamed as a tar: modes, symlinks and mtimes are kept; files are owned by
        the sandbox's root. Memory stays flat whatever the tree's size.
        """
        local_dir = os.fspath(local_dir)
        if not os.path.isdir(local_dir):
            raise NotADirectoryError(local_dir)
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[Optional[bytes]] = asyncio.Queue(maxsize=4)
        stop = threading.Event()

        class _Writer(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b: Any) -> int:
                if stop.is_set():
                    raise BrokenPipeError("upload stopped")
                data = bytes(b)
                asyncio.run_coroutine_threadsafe(chunks.put(data), loop).result()
                return len(data)

        def pack() -> None:
            try:
                w = io.BufferedWriter(_Writer(), buffer_size=_CHUNK)
                with tarfile.open(fileobj=w, mode="w|", format=tarfile.PAX_FORMAT) as tf:
                    for name in sorted(os.listdir(local_dir)):
                        tf.add(os.path.join(local_dir, name), arcname=name, recursive=True)
                w.flush()
            finally:
                if not stop.is_set():
                    asyncio.run_coroutine_threadsafe(chunks.put(None), loop).result()

        packer = loop.run_in_executor(None, pack)

        async def body() -> AsyncIterator[bytes]:
            while True:
                c = await chunks.get()
                if c is None:
                    return
                yield c

        try:
            await self._http.request(
                "PUT",
                self._path + "/tar",
                params={"path": remote_dir},
                content=body(),
                timeout=self._http.call_timeout(None),
            )
        finally:
            stop.set()
            while not packer.done():
                # Unblock a packer waiting on a full queue; it stops at its next write.
                while not chunks.empty():
                    chunks.get_nowait()
                await asyncio.sleep(0.01)
        await packer

    async def download_dir(self, remote_dir: str, local_dir: Union[str, os.PathLike[str]]) -> None:
        """Copies the sandbox directory ``remote_dir``'s contents into ``local_dir`` (made when
        missing), streamed as a tar: modes, symlinks and mtimes are kept. Entries that would
        land outside ``local_dir`` (``..``, absolute names, writes through symlinks, links
        out) raise ``ValueError`` and are not written.
        """
        local_dir = os.path.realpath(os.fspath(local_dir))
        os.makedirs(local_dir, exist_ok=True)
        loop = asyncio.get_running_loop()
        chunks: _queue.Queue[Optional[bytes]] = _queue.Queue(maxsize=4)

        class _Reader(io.RawIOBase):
            buf = b""

            def readable(self) -> bool:
                return True

            def readinto(self, b: Any) -> int:
                while not self.buf:
                    c = chunks.get()
                    if c is None:
                        return 0
                    self.buf = c
                n = min(len(b), len(self.buf))
                b[:n] = self.buf[:n]
                self.buf = self.buf[n:]
                return n

        def unpack() -> None:
            with tarfile.open(fileobj=io.BufferedReader(_Reader(), _CHUNK), mode="r|") as tf:
                for m in tf:
                    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
                        continue
                    _check_member(m, local_dir)
                    if _HAS_FILTERS:
                        tf.extract(m, local_dir, filter="fully_trusted")  # checked above
                    else:
                        tf.extract(m, local_dir)

        unpacker = loop.run_in_executor(None, unpack)
        resp = await self._http.stream("GET", self._path + "/tar", params={"path": remote_dir}, retry=True)
        try:
            async for piece in resp.aiter_raw():
                while True:
                    try:
                        chunks.put_nowait(piece)
                        break
                    except _queue.Full:
                        if unpacker.done():
                            break
                        await asyncio.sleep(0.005)
                if unpacker.done():
                    break
        except httpx.TransportError as e:
            raise _transport_error(e, f"reading {remote_dir}") from e
        finally:
            await resp.aclose()
            while not unpacker.done():
                try:
                    chunks.put_nowait(None)
                    break
                except _queue.Full:
                    await asyncio.sleep(0.005)
        await unpacker

    async def list(self, path: str = "/") -> List[FileStat]:
        """Every entry of the directory at ``path`` (names are base names), in name order,
        fetched page by page (see :meth:`list_page`)."""
        out: List[FileStat] = []
        after: Optional[str] = None
        while True:
            entries, after = await self.list_page(path, after=after)
            out.extend(entries)
            if after is None:
                return out

    async def list_page(
        self, path: str = "/", after: Optional[str] = None, limit: Optional[int] = None
    ) -> Tuple[List[FileStat], Optional[str]]:
        """One page of a directory: at most ``limit`` entries (node default 1,000) after the
        name ``after``. Returns the entries and the name to pass as ``after`` for the next
        page (``None`` after the last)."""
        params: Dict[str, Any] = {"path": path}
        if after is not None:
            params["after"] = after
        if limit is not None:
            params["limit"] = limit
        resp = await self._http.request("GET", self._path + "/list", params=params, retry=True)
        body = resp.json()
        return [FileStat.from_json(e) for e in body.get("entries", [])], body.get("next")

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


_HAS_FILTERS = hasattr(tarfile, "fully_trusted_filter")


def _check_member(m: tarfile.TarInfo, dest: str) -> None:
    """Refuses a tar entry that would be written, or link, outside ``dest``."""
    name = m.name
    if name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"tar entry {name!r} would leave {dest}")
    target = os.path.realpath(os.path.join(dest, name))
    if os.path.commonpath([dest, target]) != dest:
        raise ValueError(f"tar entry {name!r} goes through a symlink out of {dest}")
    if m.islnk():
        src = os.path.realpath(os.path.join(dest, m.linkname))
        if m.linkname.startswith("/") or os.path.commonpath([dest, src]) != dest:
            raise ValueError(f"tar entry {name!r} links to {m.linkname!r}, outside {dest}")
