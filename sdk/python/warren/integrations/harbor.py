"""A Harbor environment on Warren.

Harbor (the Terminal-Bench 2 harness) names environment classes by import path::

    harbor trials start -p path/to/task --agent oracle \\
        --environment-import-path warren.integrations.harbor:WarrenEnvironment

or in a job/trial config: ``environment: {import_path: "warren.integrations.harbor:WarrenEnvironment",
kwargs: {url: "http://gateway:7070"}}``.

The environment is one Warren sandbox. Its image is, in order: the ``image`` keyword, the
task's ``docker_image`` (a Warren image name), else the task's ``environment/Dockerfile``
applied in a sandbox of its base image (``FROM`` mapped through ``base_images``, default
``default``): ``RUN`` (through ``/bin/sh -c``), ``ENV``, ``WORKDIR``, ``USER``, ``ARG``, and
``COPY``/``ADD`` of files from the environment directory; other instructions are ignored.
Exec takes cwd, env, timeout and user; files and directories go both ways as tar streams; the
task's network policy is the sandbox's (``no-network`` is Warren's default: loopback only;
allow-lists of hosts, addresses and CIDRs; ``public``) and can change while it runs;
``stop(delete=True)`` deletes the sandbox.

Needs ``pip install 'warren-sandbox[harbor]'`` (Python 3.12 or newer, as Harbor does).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Optional, Tuple

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, NetworkPolicy

import warren

#: Harbor's name for this environment type (its classes are chosen by import path).
TYPE = "warren"


def network(policy: NetworkPolicy) -> Any:
    """The Warren network policy enforcing Harbor's ``policy``."""
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return "none"
    if policy.network_mode == NetworkMode.PUBLIC:
        return {"mode": "allow", "allow": [{"cidr": "0.0.0.0/0"}]}
    rules: List[Dict[str, Any]] = []
    domains: List[str] = []
    for host in policy.allowed_hosts:
        try:
            net = ipaddress.ip_network(host, strict=False)
        except ValueError:
            domains.append(host)
            continue
        rules.append({"cidr": str(net)})
    return {"mode": "allow", "allow": rules, "domains": domains}


def dockerfile_steps(text: str) -> List[Tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of a Dockerfile: continuations joined, comments dropped."""
    steps: List[Tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.strip().partition(" ")
        steps.append((word.upper(), rest.strip()))
    if pending.strip():
        word, _, rest = pending.strip().partition(" ")
        steps.append((word.upper(), rest.strip()))
    return steps


def _words(args: str) -> List[str]:
    """The arguments of an exec-form (JSON array) or shell-form instruction."""
    if args.startswith("["):
        try:
            v = json.loads(args)
            if isinstance(v, list):
                return [str(x) for x in v]
        except ValueError:
            pass
    return shlex.split(args)


def _env_pairs(args: str) -> Dict[str, str]:
    words = shlex.split(args)
    if len(words) >= 2 and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


class WarrenEnvironment(BaseEnvironment):
    """Harbor's ``BaseEnvironment`` over one Warren sandbox."""

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: Any,
        task_env_config: Any,
        *args: Any,
        url: Optional[str] = None,
        token: Optional[str] = None,
        image: Optional[str] = None,
        base_images: Optional[Dict[str, str]] = None,
        labels: Optional[Dict[str, str]] = None,
        **kwargs: Any,
    ) -> None:
        self._url = url
        self._token = token or os.environ.get("WARREN_TOKEN")
        self._image = image
        self._base_images = dict(base_images or {})
        self._labels = dict(labels or {})
        self._client: Optional[warren.AsyncClient] = None
        self._sandbox: Optional[warren.AsyncSandbox] = None
        self._workdir: Optional[str] = None
        super().__init__(
            environment_dir,
            environment_name,
            session_id,
            trial_paths,
            task_env_config,
            *args,
            **kwargs,
        )

    @staticmethod
    def type() -> str:
        return TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            dynamic_network_policy=True,
        )

    @property
    def _dockerfile(self) -> Path:
        return self.environment_dir / "Dockerfile"

    def _validate_definition(self) -> None:
        if self._image or self.task_env_config.docker_image:
            return
        if not self._dockerfile.is_file():
            raise FileNotFoundError(
                f"{self._dockerfile} not found: the task needs environment/Dockerfile or a docker_image"
            )

    @property
    def sandbox(self) -> warren.AsyncSandbox:
        if self._sandbox is None:
            raise RuntimeError("the environment is not started")
        return self._sandbox

    async def start(self, force_build: bool) -> None:
        kw: Dict[str, Any] = {"token": self._token} if self._token else {}
        self._client = warren.AsyncClient(self._url, **kw)
        steps: List[Tuple[str, str]] = []
        image = self._image or self.task_env_config.docker_image
        if not image:
            steps = dockerfile_steps(self._dockerfile.read_text())
            froms = [a for i, a in steps if i == "FROM"]
            base = froms[-1].split()[0] if froms else "default"
            image = self._base_images.get(base, self._base_images.get("*", "default"))
        memory = self._effective_memory_mb
        self._sandbox = await self._client.create(
            image,
            cpus=self._effective_cpus,
            memory=memory,
            network=network(self.network_policy),
            env=self._startup_env() or None,
            labels={"harness": "harbor", "harbor-session": self.session_id[:63], **self._labels},
        )
        try:
            await self._apply_dockerfile(steps)
            if self.task_env_config.workdir:
                self._workdir = self.task_env_config.workdir
            dirs = " ".join(shlex.quote(d) for d in ("/logs/agent", "/logs/verifier", "/logs/artifacts"))
            await self._run(f"mkdir -p {dirs} && chmod 777 {dirs}", user="root")
        except BaseException:
            await self.stop(delete=True)
            raise

    async def _apply_dockerfile(self, steps: List[Tuple[str, str]]) -> None:
        """The final stage's instructions, applied in the sandbox (until images are built)."""
        last_from = max((n for n, (i, _) in enumerate(steps) if i == "FROM"), default=-1)
        env: Dict[str, str] = {}
        user: Optional[str] = None
        for instr, args in steps[last_from + 1 :]:
            if instr == "RUN":
                words = _words(args) if args.startswith("[") else None
                cmd = shlex.join(words) if words else args
                r = await self.sandbox.exec(
                    ["/bin/sh", "-c", cmd], cwd=self._workdir, env=env or None, user=user, timeout=3600
                )
                if r.exit_code != 0:
                    raise RuntimeError(f"Dockerfile step `RUN {args}` failed ({r.exit_code}): {r.stderr[-2000:]}")
            elif instr == "ENV":
                env.update(_env_pairs(args))
                self._persistent_env = {**env, **self._persistent_env}
            elif instr == "ARG":
                env.update({k: v for k, v in _env_pairs(args).items()})
            elif instr == "WORKDIR":
                path = PurePosixPath(self._workdir or "/") / args.strip()
                self._workdir = str(path)
                await self.sandbox.exec(["mkdir", "-p", self._workdir], user="root")
            elif instr == "USER":
                user = args.strip() or None
            elif instr in ("COPY", "ADD"):
                words = [w for w in _words(args) if not w.startswith("--")]
                *sources, dest = words
                if not dest.startswith("/"):
                    dest = str(PurePosixPath(self._workdir or "/") / dest)
                for src in sources:
                    local = (self.environment_dir / src).resolve()
                    if not local.is_relative_to(self.environment_dir.resolve()):
                        raise ValueError(f"Dockerfile copies {src}, outside the environment directory")
                    if local.is_dir():
                        await self.upload_dir(local, dest)
                    else:
                        target = dest if not dest.endswith("/") else dest + local.name
                        await self.upload_file(local, target)
        if user is not None and self.default_user is None:
            self.default_user = user

    async def _run(self, command: str, **kw: Any) -> warren.ExecResult:
        return await self.sandbox.exec(["/bin/sh", "-c", command], **kw)

    async def stop(self, delete: bool) -> None:
        sb, self._sandbox = self._sandbox, None
        try:
            if sb is not None and delete:
                await sb.delete()
        finally:
            if self._client is not None:
                await self._client.aclose()
                self._client = None

    async def exec(
        self,
        command: str,
        cwd: Optional[str] = None,
        env: Optional[Dict[str, str]] = None,
        timeout_sec: Optional[int] = None,
        user: Any = None,
    ) -> ExecResult:
        who = self._resolve_user(user)
        r = await self.sandbox.exec(
            ["bash", "-c", command],
            cwd=cwd or self.task_env_config.workdir or self._workdir,
            env=self._merge_env(env),
            timeout=timeout_sec,
            user=None if who is None else str(who),
        )
        if r.timed_out:
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds")
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        return ExecResult(stdout=r.stdout, stderr=r.stderr, return_code=code)

    async def _parent(self, path: str) -> None:
        parent = str(PurePosixPath(path).parent)
        await self.sandbox.files.mkdir(parent, parents=True)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._parent(target_path)
        await self.sandbox.files.upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self.sandbox.files.upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await self.sandbox.files.download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        await self.sandbox.files.download_dir(source_dir, target_dir)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        await self.sandbox.set_network(network(network_policy))
