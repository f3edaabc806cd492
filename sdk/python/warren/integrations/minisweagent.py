"""A mini-swe-agent environment on Warren.

Select it by its dotted path wherever mini-swe-agent takes an environment class::

    environment:
      environment_class: warren.integrations.minisweagent.WarrenEnvironment
      image: default
      cwd: /repo

or in Python::

    from minisweagent.environments import get_environment
    env = get_environment({"environment_class": "warren.integrations.minisweagent.WarrenEnvironment"})

Each ``execute`` is one exec in the environment's sandbox, with stderr merged into stdout in
order (as mini-swe-agent's docker environment reads them) and, unless ``steps`` is off, an
exactly-once step number: a retried step after a dropped connection answers the one run
instead of running the command twice, and the sandbox's trajectory holds every step.
``cleanup`` (also run when the object is collected) deletes the sandbox unless ``keep`` is set
or the sandbox was attached by ``sandbox_id``.

Needs ``pip install 'warren-sandbox[minisweagent]'`` (mini-swe-agent 2.x).
"""

from __future__ import annotations

import os
import platform
from typing import Any, Dict, List, Optional, Union

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

import warren

#: The first output line with which a command says the task is done (mini-swe-agent's).
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class WarrenEnvironmentConfig(BaseModel):
    """Keyword arguments of :class:`WarrenEnvironment`."""

    image: Union[str, List[str]] = "default"
    """Image name, or a stack of layer refs (lowest first)."""
    cwd: str = "/"
    """Working directory of commands (unless ``execute`` gets one)."""
    env: Dict[str, str] = {}
    """Environment variables of every command."""
    forward_env: List[str] = []
    """Variables copied from the host's environment when set there (``env`` wins)."""
    timeout: int = 30
    """Seconds a command may run (unless ``execute`` gets a timeout)."""
    interpreter: List[str] = ["bash", "-lc"]
    """The command is appended to this argv."""
    url: Optional[str] = None
    """The Warren node or gateway (default: ``WARREN_URL``, else the local node's socket)."""
    token: Optional[str] = None
    """API token (default: ``WARREN_TOKEN``)."""
    memory: Union[int, str, None] = None
    cpus: Optional[float] = None
    disk: Union[int, str, None] = None
    network: Union[str, Dict[str, Any], None] = None
    """``"none"`` (default: loopback only) or a policy dict (see ``warren.network_policy``)."""
    ttl: Optional[float] = None
    """Hard lifetime of the sandbox in seconds."""
    labels: Dict[str, str] = {}
    sandbox_id: Optional[str] = None
    """Attach to this existing sandbox (e.g. a fork of a prepared one) instead of creating one;
    it is left alone at cleanup."""
    keep: bool = False
    """Leave the sandbox running at cleanup."""
    steps: bool = True
    """Give every command an exactly-once step number in the sandbox's trajectory."""
    first_step: int = 0
    """The step number of the first command (continue a trajectory)."""


class WarrenEnvironment:
    """mini-swe-agent's ``Environment`` protocol over one Warren sandbox."""

    def __init__(self, *, config_class: type = WarrenEnvironmentConfig, **kwargs: Any) -> None:
        self.config = config_class(**kwargs)
        self.sandbox: Optional[warren.Sandbox] = None
        self._owned = self.config.sandbox_id is None
        kw: Dict[str, Any] = {}
        token = self.config.token or os.environ.get("WARREN_TOKEN")
        if token:
            kw["token"] = token
        self.client = warren.Client(self.config.url, **kw)
        self._step = self.config.first_step
        try:
            if self.config.sandbox_id:
                self.sandbox = self.client.get(self.config.sandbox_id)
            else:
                self.sandbox = self.client.create(
                    self.config.image,
                    memory=self.config.memory,
                    cpus=self.config.cpus,
                    disk=self.config.disk,
                    network=self.config.network,
                    ttl=self.config.ttl,
                    labels={"harness": "mini-swe-agent", **self.config.labels},
                )
        except BaseException:
            self.client.close()
            raise

    @property
    def sandbox_id(self) -> str:
        assert self.sandbox is not None, "the environment has no sandbox"
        return self.sandbox.id

    def _env(self) -> Dict[str, str]:
        env = {k: v for k in self.config.forward_env if (v := os.environ.get(k)) is not None}
        env.update(self.config.env)
        return env

    def execute(self, action: dict, cwd: str = "", *, timeout: Optional[int] = None) -> Dict[str, Any]:
        """Runs ``action["command"]``; answers ``{output, returncode, exception_info}``."""
        command = action.get("command", "")
        cwd = cwd or self.config.cwd
        limit = timeout or self.config.timeout
        assert self.sandbox is not None, "the environment has no sandbox"
        # stderr joins stdout in the order written, as one stream.
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "sh", *self.config.interpreter, command]
        step = None
        if self.config.steps:
            step = self._step
            self._step += 1
        try:
            r = self.sandbox.exec(argv, cwd=cwd, env=self._env() or None, timeout=limit, step=step)
        except warren.WarrenError as e:
            output: Dict[str, Any] = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e}",
                "extra": {"exception_type": type(e).__name__, "exception": str(e)},
            }
        else:
            text = r.stdout if isinstance(r.stdout, str) else r.stdout.decode("utf-8", "replace")
            if r.timed_out:
                output = {
                    "output": text,
                    "returncode": -1,
                    "exception_info": (
                        f"An error occurred while executing the command: Command '{command}' "
                        f"timed out after {limit} seconds"
                    ),
                    "extra": {"exception_type": "TimeoutExpired", "exception": f"timed out after {limit} s"},
                }
            else:
                code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
                output = {"output": text, "returncode": code, "exception_info": ""}
        self._check_finished(output)
        return output

    def _check_finished(self, output: Dict[str, Any]) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> Dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                    "sandbox_id": self.sandbox.id if self.sandbox is not None else None,
                }
            }
        }

    def cleanup(self) -> None:
        """Deletes the sandbox (unless kept or attached) and closes the client."""
        sb, self.sandbox = self.sandbox, None
        try:
            if sb is not None and self._owned and not self.config.keep:
                sb.delete()
        finally:
            client = getattr(self, "client", None)
            if client is not None:
                client.close()
                self.client = None  # type: ignore[assignment]

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:
            pass
