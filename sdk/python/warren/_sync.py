"""The blocking client. It holds an :class:`~warren.AsyncClient` and runs its coroutines on a
private event-loop thread; every method here is made from the async method of the same name,
so there is one implementation, with one signature and one docstring."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterator, List, Optional, Sequence, TypeVar, Union

from ._client import AsyncClient
from ._exec import AsyncExecStream, AsyncProcess, Command
from ._files import AsyncFiles
from ._models import ExecResult, OutputChunk, ReviveReport, SandboxInfo
from ._pty import AsyncPty
from ._sandboxes import AsyncSandbox
from ._trajectory import AsyncTrajectory

__all__ = ["Client", "Sandbox", "Files", "Process", "ExecStream", "Pty", "Trajectory"]

T = TypeVar("T")


async def _as_coroutine(aw: Awaitable[T]) -> T:
    return await aw


class _Portal:
    """An event loop running forever on a daemon thread; blocking callers submit coroutines."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="warren-sync-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, aw: Awaitable[T]) -> T:
        coro = aw if asyncio.iscoroutine(aw) else _as_coroutine(aw)
        if self.pid != os.getpid():
            coro.close()
            raise RuntimeError(
                "this warren.Client was made before os.fork(); its connections belong to the parent. "
                "Make a new warren.Client in the child process."
            )
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("a blocking warren call was made from inside the SDK's own event loop")
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise


_portal: Optional[_Portal] = None
_portal_lock = threading.Lock()


def _get_portal() -> _Portal:
    """The process's portal; a forked child gets a fresh one (threads do not survive fork)."""
    global _portal
    p = _portal
    if p is None or p.pid != os.getpid():
        with _portal_lock:
            p = _portal
            if p is None or p.pid != os.getpid():
                p = _portal = _Portal()
    return p


def _wrap(value: Any, portal: _Portal) -> Any:
    """Turns async SDK objects in a result into their blocking counterparts."""
    if isinstance(value, AsyncSandbox):
        return Sandbox._of(value, portal)
    if isinstance(value, ReviveReport) and isinstance(value.sandbox, AsyncSandbox):
        return dataclasses.replace(value, sandbox=Sandbox._of(value.sandbox, portal))
    if isinstance(value, AsyncProcess):
        return Process(value, portal)
    if isinstance(value, AsyncPty):
        return Pty(value, portal)
    if isinstance(value, list) and value and isinstance(value[0], (AsyncSandbox, AsyncProcess)):
        return [_wrap(v, portal) for v in value]
    return value


def _blocking(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A blocking method that runs the async method of the same name on the wrapped object."""
    name = fn.__name__

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        portal = self._portal
        return _wrap(portal.run(getattr(self._async, name)(*args, **kwargs)), portal)

    method.__qualname__ = name
    return method


if TYPE_CHECKING:  # precise types for checkers; at run time these are _blocking
    from typing_extensions import Concatenate, ParamSpec

    P = ParamSpec("P")
    R = TypeVar("R")

    def _sync(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> Callable[Concatenate[Any, P], R]: ...

    def _sync_sandbox(
        fn: Callable[Concatenate[Any, P], Awaitable[Any]],
    ) -> Callable[Concatenate[Any, P], Sandbox]: ...

    def _sync_sandboxes(
        fn: Callable[Concatenate[Any, P], Awaitable[Any]],
    ) -> Callable[Concatenate[Any, P], List[Sandbox]]: ...

    def _sync_process(
        fn: Callable[Concatenate[Any, P], Awaitable[Any]],
    ) -> Callable[Concatenate[Any, P], Process]: ...

    def _sync_pty(fn: Callable[Concatenate[Any, P], Awaitable[Any]]) -> Callable[Concatenate[Any, P], Pty]: ...

else:
    _sync = _sync_sandbox = _sync_sandboxes = _sync_process = _sync_pty = _blocking


class Process:
    """A background process started by :meth:`Sandbox.spawn` (blocking twin of
    :class:`~warren.AsyncProcess`)."""

    def __init__(self, aproc: AsyncProcess, portal: _Portal) -> None:
        self._async = aproc
        self._portal = portal

    @property
    def pid(self) -> int:
        """The process id inside the sandbox."""
        return self._async.pid

    @property
    def argv(self) -> List[str]:
        """The command line, when known."""
        return self._async.argv

    def __repr__(self) -> str:
        return repr(self._async)

    info = _sync(AsyncProcess.info)
    wait = _sync(AsyncProcess.wait)
    kill = _sync(AsyncProcess.kill)


class Files:
    """File calls of one sandbox (``sandbox.files``; blocking twin of :class:`~warren.AsyncFiles`)."""

    def __init__(self, afiles: AsyncFiles, portal: _Portal) -> None:
        self._async = afiles
        self._portal = portal

    read = _sync(AsyncFiles.read)
    read_text = _sync(AsyncFiles.read_text)
    write = _sync(AsyncFiles.write)
    upload = _sync(AsyncFiles.upload)
    download = _sync(AsyncFiles.download)
    upload_dir = _sync(AsyncFiles.upload_dir)
    download_dir = _sync(AsyncFiles.download_dir)
    list = _sync(AsyncFiles.list)
    list_page = _sync(AsyncFiles.list_page)
    stat = _sync(AsyncFiles.stat)
    exists = _sync(AsyncFiles.exists)
    remove = _sync(AsyncFiles.remove)
    mkdir = _sync(AsyncFiles.mkdir)
    chmod = _sync(AsyncFiles.chmod)

    @functools.wraps(AsyncFiles.iter_read)
    def iter_read(self, path: str, chunk_size: Optional[int] = 1 << 20) -> Iterator[bytes]:
        agen = self._async.iter_read(path, chunk_size)
        try:
            while True:
                try:
                    yield self._portal.run(agen.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            self._portal.run(agen.aclose())


class ExecStream:
    """A command whose output arrives while it runs: an iterator of :class:`OutputChunk`
    (blocking twin of :class:`~warren.AsyncExecStream`). After the iteration,
    :attr:`result` holds the :class:`ExecResult`."""

    def __init__(self, astream: AsyncExecStream, portal: _Portal) -> None:
        self._async = astream
        self._portal = portal

    @property
    def result(self) -> Optional[ExecResult]:
        """The command's result once the stream has ended, else ``None``."""
        return self._async.result

    def __iter__(self) -> ExecStream:
        return self

    def __next__(self) -> OutputChunk:
        try:
            return self._portal.run(self._async.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    wait = _sync(AsyncExecStream.wait)
    close = _sync(AsyncExecStream.aclose)

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Pty:
    """An interactive terminal (blocking twin of :class:`~warren.AsyncPty`)."""

    def __init__(self, apty: AsyncPty, portal: _Portal) -> None:
        self._async = apty
        self._portal = portal

    @property
    def exit_code(self) -> Optional[int]:
        """Exit status of the program once it has exited normally."""
        return self._async.exit_code

    @property
    def signal(self) -> Optional[int]:
        """Signal number once the program was killed by a signal."""
        return self._async.signal

    @property
    def exited(self) -> bool:
        """True once the terminal has ended."""
        return self._async.exited

    send = _sync(AsyncPty.send)
    resize = _sync(AsyncPty.resize)
    recv = _sync(AsyncPty.recv)
    read_until = _sync(AsyncPty.read_until)
    wait = _sync(AsyncPty.wait)
    close = _sync(AsyncPty.close)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            data = self.recv()
            if not data:
                return
            yield data

    def __enter__(self) -> Pty:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Trajectory:
    """Numbers one sandbox's calls as trajectory steps (blocking twin of
    :class:`~warren.AsyncTrajectory`; made by :meth:`Sandbox.trajectory_session`)."""

    def __init__(self, atraj: AsyncTrajectory, sandbox: Sandbox) -> None:
        self._async = atraj
        self._portal = sandbox._portal
        self.sandbox = sandbox

    @property
    def step(self) -> int:
        """The step the next call will take."""
        return self._async.step

    def __repr__(self) -> str:
        return repr(self._async)

    @functools.wraps(AsyncTrajectory.skip)
    def skip(self, n: int = 1) -> None:
        self._async.skip(n)

    @functools.wraps(AsyncTrajectory.exec)
    def exec(self, cmd: Command, **kwargs: Any) -> ExecResult:
        return self._portal.run(self._async.exec(cmd, **kwargs))

    @functools.wraps(AsyncTrajectory.spawn)
    def spawn(self, cmd: Command, **kwargs: Any) -> Process:
        return Process(self._portal.run(self._async.spawn(cmd, **kwargs)), self._portal)

    write = _sync(AsyncTrajectory.write)
    mkdir = _sync(AsyncTrajectory.mkdir)
    remove = _sync(AsyncTrajectory.remove)
    chmod = _sync(AsyncTrajectory.chmod)


class Sandbox:
    """One sandbox (blocking twin of :class:`~warren.AsyncSandbox`). ``with`` deletes it when
    the block ends.

    Attributes:
        files: File calls (:class:`Files`).
    """

    _async: AsyncSandbox
    _portal: _Portal
    files: Files

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("sandboxes come from Client.create, Client.get or Client.list")

    @classmethod
    def _of(cls, asb: AsyncSandbox, portal: _Portal) -> Sandbox:
        self = object.__new__(cls)
        self._async = asb
        self._portal = portal
        self.files = Files(asb.files, portal)
        return self

    @property
    def id(self) -> str:
        """The sandbox id (``<node>-<ulid>``)."""
        return self._async.id

    @property
    def info(self) -> SandboxInfo:
        """The last :class:`SandboxInfo` seen (see :meth:`refresh`)."""
        return self._async.info

    def __repr__(self) -> str:
        return repr(self._async)

    refresh = _sync(AsyncSandbox.refresh)
    exec = _sync(AsyncSandbox.exec)
    spawn = _sync_process(AsyncSandbox.spawn)
    processes = _sync(AsyncSandbox.processes)
    pty = _sync_pty(AsyncSandbox.pty)
    pause = _sync(AsyncSandbox.pause)
    resume = _sync(AsyncSandbox.resume)
    extend = _sync(AsyncSandbox.extend)
    stats = _sync(AsyncSandbox.stats)
    network = _sync(AsyncSandbox.network)
    set_network = _sync(AsyncSandbox.set_network)
    fork = _sync_sandboxes(AsyncSandbox.fork)
    trajectory = _sync(AsyncSandbox.trajectory)
    snapshot = _sync(AsyncSandbox.snapshot)
    delete = _sync(AsyncSandbox.delete)
    http = _sync(AsyncSandbox.http)

    @functools.wraps(AsyncSandbox.port_path)
    def port_path(self, port: int, path: str = "/") -> str:
        return self._async.port_path(port, path)

    @functools.wraps(AsyncSandbox.url)
    def url(self, port: int, path: str = "/") -> str:
        return self._async.url(port, path)

    @functools.wraps(AsyncSandbox.trajectory_session)
    def trajectory_session(self, start: int = 0) -> Trajectory:
        return Trajectory(self._async.trajectory_session(start), self)

    @functools.wraps(AsyncSandbox.exec_stream)
    def exec_stream(self, *args: Any, **kwargs: Any) -> ExecStream:
        return ExecStream(self._async.exec_stream(*args, **kwargs), self._portal)

    @functools.wraps(AsyncSandbox.process)
    def process(self, pid: int) -> Process:
        return Process(self._async.process(pid), self._portal)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()


class Client:
    """The blocking client of one Warren node or of the gateways of a cluster; takes the
    arguments of :class:`~warren.AsyncClient` (``url`` may list several). Safe to share
    between threads. ``with`` closes it."""

    def __init__(self, url: Union[str, Sequence[str], None] = None, **kwargs: Any) -> None:
        self._portal = _get_portal()
        self._async = AsyncClient(url, **kwargs)

    @property
    def url(self) -> str:
        """The address calls go to first: the one that answered last."""
        return self._async.url

    @property
    def urls(self) -> List[str]:
        """Every address of this client, in the order given."""
        return self._async.urls

    def __repr__(self) -> str:
        return f"<Client {self.url}>"

    health = _sync(AsyncClient.health)
    call = _sync(AsyncClient.call)
    create = _sync_sandbox(AsyncClient.create)
    get = _sync_sandbox(AsyncClient.get)
    revive = _sync(AsyncClient.revive)
    revive_and_continue = _sync(AsyncClient.revive_and_continue)
    list = _sync_sandboxes(AsyncClient.list)
    delete_all = _sync(AsyncClient.delete_all)
    snapshots = _sync(AsyncClient.snapshots)
    get_snapshot = _sync(AsyncClient.get_snapshot)
    delete_snapshot = _sync(AsyncClient.delete_snapshot)
    images = _sync(AsyncClient.images)
    image = _sync(AsyncClient.image)
    delete_image = _sync(AsyncClient.delete_image)
    gc_images = _sync(AsyncClient.gc_images)
    import_image = _sync(AsyncClient.import_image)
    pull_image = _sync(AsyncClient.pull_image)
    build_image = _sync(AsyncClient.build_image)
    cluster = _sync(AsyncClient.cluster)
    drain = _sync(AsyncClient.drain)
    undrain = _sync(AsyncClient.undrain)

    def close(self) -> None:
        """Closes the connection pool."""
        self._portal.run(self._async.aclose())

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
