"""What the per-sandbox parts (exec, files, trajectory) need of the sandbox they belong to.

The parts are made by :class:`~warren.AsyncSandbox` and talk through its client; they name it
by these protocols instead of importing ``_sandboxes`` (or ``_client``) back, so the SDK's
modules import one way: ``_client`` → ``_sandboxes`` → ``_exec``/``_files``/``_trajectory`` →
``_base``/``_models``/``_transport``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from ._models import ExecResult
    from ._transport import _Http


class ClientRef(Protocol):
    """A client: its HTTP transport."""

    _http: _Http


class SandboxRef(Protocol):
    """A sandbox as its parts see it: its id, its route prefix and its client."""

    id: str
    _path: str
    _client: ClientRef


class FileCalls(Protocol):
    """The step-numbered file calls of a sandbox (:class:`~warren.AsyncFiles`)."""

    def write(self, path: str, data: Any, mode: Any, **kwargs: Any) -> Awaitable[Any]: ...

    def mkdir(self, path: str, parents: bool, mode: Any, **kwargs: Any) -> Awaitable[Any]: ...

    def remove(self, path: str, recursive: bool, **kwargs: Any) -> Awaitable[Any]: ...

    def chmod(self, path: str, mode: int, **kwargs: Any) -> Awaitable[Any]: ...


class SandboxCalls(SandboxRef, Protocol):
    """A sandbox's step-numbered calls, as a trajectory session drives them."""

    files: FileCalls

    def exec(self, cmd: Any, **kwargs: Any) -> Awaitable[ExecResult]: ...

    def spawn(self, cmd: Any, **kwargs: Any) -> Awaitable[Any]: ...
