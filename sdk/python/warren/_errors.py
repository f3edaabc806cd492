"""The exception hierarchy, mapped from the API's stable error codes."""

from __future__ import annotations

import builtins
from typing import TYPE_CHECKING, Any, Dict, Optional, Type

if TYPE_CHECKING:  # pragma: no cover
    from ._models import ExecResult

__all__ = [
    "WarrenError",
    "InvalidRequest",
    "InvalidPath",
    "NotFound",
    "Conflict",
    "InvalidState",
    "LimitExceeded",
    "Busy",
    "Forbidden",
    "QuotaExceeded",
    "Timeout",
    "Unauthorized",
    "Unsupported",
    "UnsupportedSubstrate",
    "StartFailed",
    "SandboxLost",
    "FileError",
    "ServerError",
    "Unschedulable",
    "CapacityUnavailable",
    "NodeUnreachable",
    "PortUnreachable",
    "RegistryUnreachable",
    "StepConflict",
    "StepInterrupted",
    "BuildFailed",
    "ConnectionError",
    "CommandError",
    "error_from_body",
]


class WarrenError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: The API's stable error code (``"not_found"``, ``"busy"``, ...), or an SDK code
            (``"connection"``, ``"command_failed"``) for errors that did not come from the node.
        message: What went wrong, for a person.
        status: The HTTP status of the answer, ``None`` when there was no answer.
        retry_after: Seconds the node asked to wait before retrying (``busy``,
            ``limit_exceeded``), else ``None``.
    """

    default_code: str = "error"

    def __init__(
        self,
        message: str = "",
        *,
        code: Optional[str] = None,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message)
        self.code: str = code or self.default_code
        self.message: str = message
        self.status: Optional[int] = status
        self.retry_after: Optional[float] = retry_after

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __reduce__(self) -> Any:  # keep pickling (multiprocessing) working with keyword args
        return (
            _rebuild,
            (type(self), self.message, self.code, self.status, self.retry_after, self.__dict__),
        )


def _rebuild(
    cls: Type[WarrenError], message: str, code: str, status: Any, retry_after: Any, state: Dict[str, Any]
) -> WarrenError:
    e = cls.__new__(cls)
    WarrenError.__init__(e, message, code=code, status=status, retry_after=retry_after)
    e.__dict__.update(state)
    return e


class InvalidRequest(WarrenError):
    """The request was refused as malformed (``invalid_request``, HTTP 400)."""

    default_code = "invalid_request"


class InvalidPath(InvalidRequest):
    """A sandbox path is not absolute, has a NUL byte or climbs above ``/`` (``invalid_path``)."""

    default_code = "invalid_path"


class NotFound(WarrenError):
    """No sandbox, process, image, file or route of that name (``not_found``, HTTP 404)."""

    default_code = "not_found"


class Conflict(WarrenError):
    """The request conflicts with an earlier one, e.g. a reused idempotency key (``conflict``, 409)."""

    default_code = "conflict"


class InvalidState(Conflict):
    """The sandbox's state does not allow the call, e.g. it is stopped (``invalid_state``, 409)."""

    default_code = "invalid_state"


class LimitExceeded(WarrenError):
    """A node limit (sandbox count, memory) refuses the request (``limit_exceeded``, HTTP 429)."""

    default_code = "limit_exceeded"


class Busy(WarrenError):
    """The node is saturated; retry after :attr:`retry_after` seconds (``busy``, HTTP 429)."""

    default_code = "busy"


class Unauthorized(WarrenError):
    """No token, or a token the node does not know (``unauthorized``, HTTP 401); nothing was done.

    Pass ``token=`` or set ``WARREN_TOKEN``.
    """

    default_code = "unauthorized"


class Forbidden(WarrenError):
    """The token's role may not make this call, e.g. collecting images as a ``user`` (``forbidden``, 403)."""

    default_code = "forbidden"


class QuotaExceeded(WarrenError):
    """A tenant quota refuses the call; the message names it (``quota_exceeded``, HTTP 429).

    Retry after :attr:`retry_after` seconds.
    """

    default_code = "quota_exceeded"


class Timeout(WarrenError, builtins.TimeoutError):
    """A call did not finish in time (``timeout``, HTTP 504), or the HTTP call itself timed out."""

    default_code = "timeout"


class Unsupported(WarrenError):
    """The node does not serve this feature (yet): a substrate, or a route such as ``pause``."""

    default_code = "unsupported"


class UnsupportedSubstrate(Unsupported):
    """The requested substrate is not served by this node (``unsupported_substrate``, HTTP 501)."""

    default_code = "unsupported_substrate"


class StartFailed(WarrenError):
    """The sandbox failed to start; nothing was left behind (``start_failed``, HTTP 502)."""

    default_code = "start_failed"


class SandboxLost(WarrenError):
    """The sandbox is gone (``sandbox_lost``): its agent crashed or was killed (HTTP 502 from
    its node), or, from a cluster gateway, its node left the cluster (HTTP 410; ``revive``
    brings the episode back from its trajectory)."""

    default_code = "sandbox_lost"


class FileError(WarrenError):
    """A file operation failed inside the sandbox: permission, not a directory, ... (``file_error``, 422)."""

    default_code = "file_error"


class StepConflict(Conflict):
    """The trajectory step was already logged with a different request, or comes before a
    step already logged. Nothing ran (``step_conflict``, HTTP 409)."""

    default_code = "step_conflict"


class StepInterrupted(Conflict):
    """The step's command was running when the node's daemon went away, and its result could
    not be recovered whole (e.g. its stdin was cut off); the message says what is known
    (``step_interrupted``, HTTP 409). The step is not run again: go on with the next one."""

    default_code = "step_interrupted"


class Unschedulable(WarrenError):
    """Cluster gateway: no node of the cluster can ever hold the sandbox as asked; the
    message counts the nodes each check excluded (``unschedulable``, HTTP 422)."""

    default_code = "unschedulable"


class CapacityUnavailable(WarrenError):
    """Cluster gateway: every node that could take the call refused it for now (busy,
    draining or short of memory); retry after :attr:`retry_after` (``capacity_unavailable``,
    HTTP 503). Calls safe to repeat are retried by the client first."""

    default_code = "capacity_unavailable"


class NodeUnreachable(WarrenError):
    """Cluster gateway: the sandbox's node does not answer (``node_unreachable``, HTTP 503).
    Nothing was moved; the sandbox may come back with its node. Calls safe to repeat wait for
    the node up to the client's ``restart_wait`` before this is raised."""

    default_code = "node_unreachable"


class PortUnreachable(WarrenError):
    """Nothing listens on the sandbox's port, or it closed the connection without an HTTP
    answer (``port_unreachable``, HTTP 502)."""

    default_code = "port_unreachable"


class RegistryUnreachable(WarrenError):
    """A pull could not reach its registry (no connection, TLS, a timeout); nothing was
    tagged (``registry_unreachable``, HTTP 502)."""

    default_code = "registry_unreachable"


class BuildFailed(WarrenError):
    """An image build failed at one of its steps; nothing was tagged (422).

    Attributes:
        step: The failing step's number (1-based), when known.
        instruction: The failing instruction, after argument substitution.
        exit_code: The exit status of a failing ``RUN``.
        output_tail: The last lines of the failing command's output.
    """

    default_code = "build_failed"
    step = None
    instruction = None
    exit_code = None
    output_tail: list = []


class ServerError(WarrenError):
    """A bug or an unexpected host failure on the node (``internal``, HTTP 500, or any other 5xx)."""

    default_code = "internal"


class ConnectionError(WarrenError, builtins.ConnectionError):
    """The node could not be reached, or the connection broke mid-call (code ``connection``)."""

    default_code = "connection"


class CommandError(WarrenError):
    """A command run with ``check=True`` exited non-zero, was killed or timed out.

    Attributes:
        result: The command's :class:`~warren.ExecResult` (its ``stdout``/``stderr`` included).
        command: The command as given to ``exec``.
    """

    default_code = "command_failed"

    def __init__(self, command: Any, result: ExecResult) -> None:
        if result.timed_out:
            how = "timed out"
        elif result.signal is not None:
            how = f"was killed by signal {result.signal}"
        else:
            how = f"exited with status {result.exit_code}"
        tail = (result.stderr or result.stdout).strip()[-500:]
        message = f"command {command!r} {how}" + (f": {tail}" if tail else "")
        super().__init__(message)
        self.result = result
        self.command = command


_BY_CODE: Dict[str, Type[WarrenError]] = {
    "invalid_request": InvalidRequest,
    "invalid_path": InvalidPath,
    "not_found": NotFound,
    "invalid_state": InvalidState,
    "conflict": Conflict,
    "limit_exceeded": LimitExceeded,
    "busy": Busy,
    "timeout": Timeout,
    "unsupported_substrate": UnsupportedSubstrate,
    "start_failed": StartFailed,
    "sandbox_lost": SandboxLost,
    "file_error": FileError,
    "internal": ServerError,
    "step_conflict": StepConflict,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "quota_exceeded": QuotaExceeded,
    "unschedulable": Unschedulable,
    "capacity_unavailable": CapacityUnavailable,
    "node_unreachable": NodeUnreachable,
    "port_unreachable": PortUnreachable,
    "build_failed": BuildFailed,
    "registry_unreachable": RegistryUnreachable,
    "step_interrupted": StepInterrupted,
}

_BY_STATUS: Dict[int, Type[WarrenError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: InvalidRequest,
    409: Conflict,
    410: SandboxLost,
    422: FileError,
    429: Busy,
    501: Unsupported,
    504: Timeout,
}


def error_from_body(status: Optional[int], body: Any, retry_after_header: Optional[str] = None) -> WarrenError:
    """Builds the exception for an error answer from its status and decoded JSON body.

    The class follows the stable ``code``; an unknown code falls back on the HTTP status.
    """
    code: Optional[str] = None
    message = ""
    retry_after: Optional[float] = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = str(err.get("message", ""))
        ra = err.get("retry_after")
        if isinstance(ra, (int, float)):
            retry_after = float(ra)
    elif isinstance(body, str):
        message = body.strip()[:1000]
    if retry_after is None and retry_after_header:
        try:
            retry_after = float(retry_after_header)
        except ValueError:
            pass
    cls = _BY_CODE.get(code or "")
    if cls is None:
        if status is None:
            cls = WarrenError
        else:
            cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else WarrenError)
    if not message:
        message = f"HTTP {status}" if status is not None else "error"
    return cls(message, code=code or cls.default_code, status=status, retry_after=retry_after)
