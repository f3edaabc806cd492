"""Trajectory sessions: calls numbered as steps, so a retried call is answered from the log."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional, Union

from ._errors import ConnectionError, WarrenError
from ._models import ExecResult
from ._transport import _backoff

if TYPE_CHECKING:
    from ._exec import AsyncProcess, Command
    from ._base import SandboxCalls
    from ._transport import T


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

    def __init__(self, sandbox: SandboxCalls, start: int = 0) -> None:
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
