"""Warren: sandboxes for RL agents.

Blocking use::

    import warren

    with warren.Client() as client, client.create(memory="256M") as sb:
        print(sb.exec("python3 -c 'print(6 * 7)'").stdout)

asyncio use: :class:`AsyncClient` and :class:`AsyncSandbox` take the same arguments. The
node's address comes from ``url``, else ``WARREN_URL``, else ``unix:///run/warren/warren.sock``.
"""

from ._client import AsyncClient
from ._errors import (
    BuildFailed,
    Busy,
    CapacityUnavailable,
    CommandError,
    Conflict,
    ConnectionError,
    FileError,
    Forbidden,
    InvalidPath,
    InvalidRequest,
    InvalidState,
    LimitExceeded,
    NodeUnreachable,
    NotFound,
    PortUnreachable,
    QuotaExceeded,
    RegistryUnreachable,
    SandboxLost,
    ServerError,
    StartFailed,
    StepConflict,
    StepInterrupted,
    Timeout,
    Unauthorized,
    Unschedulable,
    Unsupported,
    UnsupportedSubstrate,
    WarrenError,
)
from ._exec import AsyncExecStream, AsyncProcess, Command
from ._files import AsyncFiles
from ._function import CallResult
from ._models import (
    Divergence,
    ExecResult,
    FileStat,
    Health,
    Limits,
    OutputChunk,
    ProcessInfo,
    ReviveReport,
    SandboxInfo,
)
from ._pty import AsyncPty
from ._sandboxes import AsyncSandbox, network_policy, parse_mib
from ._sync import Client, ExecStream, Files, Process, Pty, Sandbox, Trajectory
from ._trajectory import AsyncTrajectory
from ._transport import DEFAULT_URL

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_URL",
    "AsyncClient",
    "AsyncExecStream",
    "AsyncFiles",
    "AsyncProcess",
    "AsyncPty",
    "AsyncSandbox",
    "AsyncTrajectory",
    "BuildFailed",
    "Busy",
    "CallResult",
    "CapacityUnavailable",
    "Client",
    "Command",
    "CommandError",
    "Conflict",
    "ConnectionError",
    "Divergence",
    "ExecResult",
    "ExecStream",
    "FileError",
    "FileStat",
    "Files",
    "Forbidden",
    "Health",
    "InvalidPath",
    "InvalidRequest",
    "InvalidState",
    "LimitExceeded",
    "Limits",
    "NodeUnreachable",
    "NotFound",
    "OutputChunk",
    "PortUnreachable",
    "Process",
    "ProcessInfo",
    "Pty",
    "QuotaExceeded",
    "RegistryUnreachable",
    "ReviveReport",
    "Sandbox",
    "SandboxInfo",
    "SandboxLost",
    "ServerError",
    "StartFailed",
    "StepConflict",
    "StepInterrupted",
    "Timeout",
    "Trajectory",
    "Unauthorized",
    "Unschedulable",
    "Unsupported",
    "UnsupportedSubstrate",
    "WarrenError",
    "network_policy",
    "parse_mib",
    "__version__",
]
