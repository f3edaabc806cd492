"""A Harbor environment on Warren.

Harbor (the Terminal-Bench 2 harness) names environment classes by import path::

    harbor trials start -p path/to/task --agent oracle \\
        --environment-import-path warren.integrations.harbor:WarrenEnvironment

or in a job/trial config: ``environment: {import_path: "warren.integrations.harbor:WarrenEnvironment",
kwargs: {url: "http://gateway:7070"}}``.

The environment is one Warren sandbox. Its image is, in order: the ``image`` keyword, the
task's ``docker_image`` (a Warren image name; ``environment/`` is then uploaded into the
working directory, as Harbor does), else the task's ``environment/Dockerfile`` built by the
node's builder (``POST /v1/images/build``) with the environment directory as its context,
each ``FROM`` that names an image mapped through ``base_images`` (an exact name, else ``"*"``,
else the name itself when the node has that image, else ``default``). The image is tagged
``harbor-<task>:<digest of the Dockerfile and context>``: a later trial of the same task finds
it and builds nothing (``force_build`` builds again, through the builder's step cache).
Exec takes cwd, env, timeout and user; files and directories go both ways as tar streams; the
task's network policy is the sandbox's (``no-network`` is Warren's default: loopback only;
allow-lists of hosts, addresses and CIDRs; ``public``) and can change while it runs;
``stop(delete=True)`` deletes the sandbox.

Needs ``pip install 'warren-sandbox[harbor]'`` (Python 3.12 or newer, as Harbor does).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shlex
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, List, Optional

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


def map_bases(text: str, base_of: Callable[[str], str]) -> str:
    """``text`` with each ``FROM`` that names an image (not an earlier stage, not ``scratch``)
    naming ``base_of(image)`` instead; every other line is kept as it is."""
    stages: set = set()
    out: List[str] = []
    pending = ""
    for raw in text.splitlines():
        if pending or raw.rstrip().endswith("\\"):
            # a continued instruction: FROM never spans lines in practice; keep it verbatim
            pending = raw if raw.rstrip().endswith("\\") else ""
            out.append(raw)
            continue
        words = raw.split()
        if len(words) >= 2 and words[0].upper() == "FROM":
            i = 1
            while i < len(words) and words[i].startswith("--"):
                i += 1
            if i < len(words):
                image = words[i]
                if image.lower() not in stages and image != "scratch" and "$" not in image:
                    words[i] = base_of(image)
                if i + 2 < len(words) and words[i + 1].upper() == "AS":
                    stages.add(words[i + 2].lower())
            out.append(" ".join(words))
        else:
            out.append(raw)
    return "\n".join(out) + "\n"


def context_digest(directory: Path, dockerfile: str) -> str:
    """A digest of what a build reads: the Dockerfile and every file of the context (paths,
    modes, contents, link targets)."""
    h = hashlib.sha256()
    h.update(dockerfile.encode())
    root = directory.resolve()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        h.update(f"\0{rel}\0{st.st_mode:o}\0".encode())
        if path.is_symlink():
            h.update(os.readlink(path).encode())
        elif path.is_file():
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def image_tag(name: str, digest: str) -> str:
    """The Warren image a task's environment is built as: one per task name and context."""
    base = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip(".-")[:100] or "task"
    return f"harbor-{base}:{digest[:20]}"


#: The environments this process started, in order: ``{"image", "built"}`` (``built`` is False
#: when the image was found from an earlier build of the same task).
builds: List[Dict[str, Any]] = []


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
        build_memory_mb: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        self._url = url
        self._token = token or os.environ.get("WARREN_TOKEN")
        self._image = image
        self._base_images = dict(base_images or {})
        self._labels = dict(labels or {})
        self._client: Optional[warren.AsyncClient] = None
        self._sandbox: Optional[warren.AsyncSandbox] = None
        self._build_memory_mb = build_memory_mb
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

    def _base(self, image: str, have: set) -> str:
        """The Warren image a task's ``FROM image`` builds on."""
        if image in self._base_images:
            return self._base_images[image]
        if "*" in self._base_images:
            return self._base_images["*"]
        return image if image in have else "default"

    async def _build(self, client: warren.AsyncClient, force_build: bool) -> str:
        """The task's image, built from ``environment/Dockerfile`` by the node's builder
        unless an earlier trial of the same task (same Dockerfile and context) built it."""
        text = self._dockerfile.read_text()
        have = {i.get("reference", "") for i in await client.images()}
        have |= {r.rsplit(":", 1)[0] for r in have if r.endswith(":latest")}
        mapped = map_bases(text, lambda image: self._base(image, have))
        tag = image_tag(self.environment_name, context_digest(self.environment_dir, mapped))
        if not force_build:
            try:
                await client.image(tag)
                builds.append({"image": tag, "built": False})
                return tag
            except warren.NotFound:
                pass
        with tempfile.TemporaryDirectory(prefix="warren-harbor-") as d:
            dockerfile = Path(d) / "Dockerfile"
            dockerfile.write_text(mapped)
            self.logger.debug(f"Building {tag} from {self._dockerfile}")
            await client.build_image(
                str(self.environment_dir),
                tag,
                dockerfile=str(dockerfile),
                memory=self._build_memory_mb,
            )
        builds.append({"image": tag, "built": True})
        return tag

    async def start(self, force_build: bool) -> None:
        kw: Dict[str, Any] = {"token": self._token} if self._token else {}
        self._client = warren.AsyncClient(self._url, **kw)
        prebuilt = self._image or self.task_env_config.docker_image
        try:
            image = prebuilt or await self._build(self._client, force_build)
            self._sandbox = await self._client.create(
                image,
                cpus=self._effective_cpus,
                memory=self._effective_memory_mb,
                network=network(self.network_policy),
                env=self._startup_env() or None,
                labels={"harness": "harbor", "harbor-session": self.session_id[:63], **self._labels},
            )
        except BaseException:
            await self.stop(delete=True)
            raise
        try:
            dirs = " ".join(shlex.quote(d) for d in ("/logs/agent", "/logs/verifier", "/logs/artifacts"))
            await self._run(f"mkdir -p {dirs} && chmod 777 {dirs}", user="root")
            if prebuilt:
                await self._upload_environment_dir_after_start()
        except BaseException:
            await self.stop(delete=True)
            raise

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
            cwd=cwd or self.task_env_config.workdir,
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
