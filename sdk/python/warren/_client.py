"""The asyncio client: the one implementation of the SDK (the sync client wraps it). Its parts
live beside it: ``_transport``, ``_sandboxes``, ``_exec``, ``_files``, ``_pty``, ``_trajectory``
and ``_function``."""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._errors import CommandError, NodeUnreachable
from ._function import CallResult, call_body
from ._models import Health, ReviveReport, SandboxInfo
from ._sandboxes import AsyncSandbox, _secs, parse_mib
from ._transport import _Http

if TYPE_CHECKING:
    from ._exec import Command


class AsyncClient:
    """The asyncio client of one Warren node, or of the gateways of a cluster.

    Args:
        url: ``unix:///path/to/warren.sock`` or ``http://host:port``, or several (a list, or
            one string with commas) -- the gateways of a cluster. Default: the
            ``WARREN_URL`` environment variable (which may list several), else
            ``unix:///run/warren/warren.sock``. Calls go to the URL that answered last; a
            request that could not be sent goes to the next URL, and calls that are safe to
            repeat also move on after a broken connection or a ``503``.
        timeout: Seconds an ordinary call may take (exec and waits use their own timeouts).
        max_connections: Size of the connection pool; each concurrent call holds one
            connection, so this is how many calls run at once (more wait their turn).
        token: The API token of a node started with ``--auth``, sent as
            ``Authorization: Bearer``. Default: the ``WARREN_TOKEN`` environment variable.
        ca: A PEM file of the CAs to trust for ``https`` URLs. Default: ``WARREN_CA``, else
            the system's CAs.
        max_retries: Waits before trying again, for safe calls (reads, deletes, creates with
            an idempotency key, logged steps) after transport failures, ``503`` on every URL
            and ``busy`` answers; each wait is the server's ``Retry-After`` (at most 30 s) or a
            backoff.
        restart_wait: Seconds a call waits for a node that does not answer at all (its
            daemon restarting: connections refused or broken, or ``503 node_unreachable``
            from a gateway) before the waits above, then it raises with a message naming this
            setting. Calls that may have reached the node wait only when safe to repeat; a
            logged step is, because the node runs it once and answers that run. Default:
            ``WARREN_RESTART_WAIT``, else 30. ``0`` raises at once.

    One client serves thousands of concurrent calls from one event loop. Use it from the loop
    it was first used on; ``async with`` closes it.
    """

    def __init__(
        self,
        url: Union[str, Sequence[str], None] = None,
        *,
        timeout: float = 120.0,
        max_connections: int = 4096,
        max_retries: int = 5,
        token: Optional[str] = None,
        ca: Optional[str] = None,
        restart_wait: Optional[float] = None,
    ) -> None:
        self._http = _Http(
            url, timeout, max_connections, max_retries, token=token, ca=ca, restart_wait=restart_wait
        )

    @property
    def url(self) -> str:
        """The address calls go to first (``unix:///...`` or ``http://...``): the one that
        answered last."""
        return self._http.url

    @property
    def urls(self) -> List[str]:
        """Every address of this client, in the order given."""
        return self._http.urls

    def __repr__(self) -> str:
        return f"<AsyncClient {self.url}>"

    async def health(self) -> Health:
        """The node's :class:`Health`: its id, version and the substrates it serves."""
        resp = await self._http.request("GET", "/v1/health", retry=True)
        return Health.from_json(resp.json())

    async def create(
        self,
        image: Union[str, Sequence[str]] = "default",
        *,
        substrate: str = "container",
        cpus: Optional[float] = None,
        memory: Union[int, str, None] = None,
        disk: Union[int, str, None] = None,
        disk_medium: Optional[str] = None,
        pids: Optional[int] = None,
        cpu_class: Optional[str] = None,
        trajectory: Union[int, str, None] = None,
        ttl: Union[int, float, datetime.timedelta, None] = None,
        idle_timeout: Union[int, float, datetime.timedelta, None] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[str] = None,
        user: Optional[str] = None,
        network: Union[str, Mapping[str, Any], None] = None,
        labels: Optional[Mapping[str, str]] = None,
        idempotency_key: Optional[str] = None,
        hostname: Optional[str] = None,
        pty: bool = False,
        snapshot: Optional[str] = None,
    ) -> AsyncSandbox:
        """Creates a sandbox and returns it once it runs.

        Args:
            image: An image name (``"default"``) or a stack of layer refs, lowest first.
            substrate: ``"container"``, ``"function"``, ``"microvm"`` or ``"vm"``; everything
                else stays the same. A substrate the node does not serve raises
                :class:`~warren.UnsupportedSubstrate`.
            cpus: CPU cores (fractions allowed).
            memory: MiB as an int, or a string like ``"512M"`` / ``"1G"``. The writable layer
                counts against it.
            disk: Size of the writable layer, like ``memory``. A ``container``'s lives on the
                node's disk by default, with a quota of its own, independent of ``memory``; in
                memory (``disk_medium="memory"``, and a ``function``'s calls) it is at most
                ``memory`` (its default).
            disk_medium: Where a ``container``'s writable layer lives: ``"disk"`` (the node's
                default where it has a writable-layer file system) or ``"memory"`` (a tmpfs
                charged to ``memory``).
            pids: Maximum processes and threads.
            cpu_class: ``"normal"`` (default) or ``"best_effort"``: lowest CPU weight and
                ``SCHED_IDLE``, so busy best-effort sandboxes do not starve normal ones.
            trajectory: Trajectory budget, like ``memory`` (node default 32 MiB): output of
                calls after the log holds this much is kept as sha256 and size only.
            ttl: Hard lifetime (seconds or a timedelta); the sandbox is deleted when it expires.
            idle_timeout: Seconds without any call after which the sandbox is stopped.
            env: Environment of every command.
            workdir: Default working directory (absolute).
            user: Default user: a name from the image's /etc/passwd or ``uid[:gid]``.
            network: Network policy: ``"none"`` (the default: loopback only) or a policy dict
                (see :func:`network_policy` and :meth:`AsyncSandbox.set_network`).
            labels: Key/value labels, for :meth:`list` and :meth:`delete_all`.
            idempotency_key: A repeated create with the same key returns the first sandbox;
                with a key, the create is retried on transport failures.
            hostname: The sandbox's host name.
            pty: Mount /dev/pts at start, for programs inside that open terminals themselves
                (otherwise the first terminal mounts it).
            snapshot: Start from this snapshot (``sandbox.snapshot()``): its substrate, image and
                limits (leave them unset or equal), env, workdir, user and network unless given.
                A VM's processes continue where they were.
        """
        body: Dict[str, Any] = {
            "substrate": substrate,
            "image": image if isinstance(image, str) else list(image),
        }
        if cpus is not None:
            body["cpus"] = float(cpus)
        mem = parse_mib(memory, "memory")
        if mem is not None:
            body["memory_mb"] = mem
        dsk = parse_mib(disk, "disk")
        if dsk is not None:
            body["disk_mb"] = dsk
        if disk_medium is not None:
            body["disk_medium"] = disk_medium
        if pids is not None:
            body["pids"] = int(pids)
        if cpu_class is not None:
            body["cpu_class"] = cpu_class
        traj = parse_mib(trajectory, "trajectory")
        if traj is not None:
            body["trajectory_mb"] = traj
        t = _secs(ttl, "ttl")
        if t is not None:
            body["ttl_secs"] = t
        t = _secs(idle_timeout, "idle_timeout")
        if t is not None:
            body["idle_timeout_secs"] = t
        if env:
            body["env"] = dict(env)
        if workdir is not None:
            body["workdir"] = workdir
        if user is not None:
            body["user"] = user
        if network is not None:
            body["network"] = network if isinstance(network, str) else dict(network)
        if labels:
            body["labels"] = dict(labels)
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        if hostname is not None:
            body["hostname"] = hostname
        if pty:
            body["pty"] = True
        if snapshot is not None:
            body["snapshot"] = snapshot
            if image == "default":
                body.pop("image", None)
            if substrate == "container":
                body.pop("substrate", None)
        resp = await self._http.request("POST", "/v1/sandboxes", json=body, retry=idempotency_key is not None)
        return AsyncSandbox(self, SandboxInfo.from_json(resp.json()))

    async def call(
        self,
        image: Union[str, Sequence[str]],
        cmd: Command,
        *,
        files: Optional[Mapping[str, Union[str, bytes]]] = None,
        stdin: Union[str, bytes, None] = None,
        timeout: Optional[float] = None,
        limits: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        return_files: Optional[Sequence[str]] = None,
        interpreter: Optional[str] = None,
        preload: Optional[Sequence[str]] = None,
        max_output: Optional[int] = None,
        check: bool = False,
    ) -> CallResult:
        """Runs one stateless command in a warm container of ``image`` and returns its
        :class:`CallResult`.

        Every call starts from the image as built: nothing of an earlier call (files,
        processes, environment) is visible, and everything the call started is killed when
        its command ends.

        Args:
            image: An image name or a stack of layer refs, lowest first.
            cmd: A string runs through ``/bin/sh -c``; a list is an argv run directly.
            files: Path to contents (text or bytes) written before the command starts.
            stdin: Text (or UTF-8 bytes) fed to stdin, then closed.
            timeout: Seconds; when exceeded everything the call started is killed.
            limits: ``cpus``, ``memory`` and ``disk`` (MiB or ``"512M"``), ``pids`` of the
                pool's containers; calls with the same image, limits and interpreter share a pool.
            env: Environment of the command.
            cwd: Working directory (absolute).
            return_files: Paths read back after the command ended (``result.files``).
            interpreter: Keep this Python interpreter (``"python3"``) started in the pool's
                warm environments; calls ``[python3, "-c", code, ...]`` or
                ``[python3, script, ...]`` are handed to it.
            preload: Modules the warm interpreter imports ahead of the call.
            max_output: Cap per output stream in bytes.
            check: Raise :class:`~warren.CommandError` unless the command exits with status 0.

        A saturated pool answers ``busy``; the call is retried after the node's
        ``retry_after`` (calls are stateless), up to ``max_retries`` times.
        """
        body = call_body(
            image,
            cmd,
            files=files,
            stdin=stdin,
            timeout=timeout,
            limits=limits,
            env=env,
            cwd=cwd,
            return_files=return_files,
            interpreter=interpreter,
            preload=preload,
            max_output=max_output,
            parse_mib=parse_mib,
        )
        resp = await self._http.request(
            "POST", "/v1/functions/call", json=body, timeout=self._http.call_timeout(timeout), retry=True
        )
        result = CallResult.from_json(resp.json())
        if check and not result.ok:
            raise CommandError(cmd, result)  # type: ignore[arg-type]
        return result

    async def get(self, sandbox_id: str) -> AsyncSandbox:
        """Reconnects to the sandbox ``sandbox_id``, made by this or any other process."""
        resp = await self._http.request("GET", f"/v1/sandboxes/{quote(sandbox_id, safe='')}", retry=True)
        return AsyncSandbox(self, SandboxInfo.from_json(resp.json()))

    async def revive(self, sandbox_id: str, stop_on_divergence: bool = False) -> ReviveReport:
        """Makes a new sandbox like ``sandbox_id`` (image stack, limits, labels, network
        policy, tenant) and runs its logged calls again in it, in order, with their steps: the
        new sandbox's trajectory continues the old step numbering, so a trainer goes on with
        the step indices it has (the next step must be above ``report.last_step``).

        Each replayed call's outcome (exit code, output digests) is compared with the logged
        one; the report counts the divergences and names the first
        (``report.first_divergence.step``). With ``stop_on_divergence`` the replay stops
        there. The sandbox may be running, or deleted when its trajectory is still readable.
        Raises :class:`~warren.NotFound` for a sandbox (or its log) the caller cannot see.
        """
        params = {"stop_on_divergence": "true"} if stop_on_divergence else None
        resp = await self._http.request(
            "POST",
            f"/v1/sandboxes/{quote(sandbox_id, safe='')}/revive",
            params=params,
            timeout=self._http.call_timeout(3600),
        )
        d = resp.json()
        return ReviveReport.from_json(d, AsyncSandbox(self, SandboxInfo.from_json(d["sandbox"])))

    async def revive_and_continue(
        self, sandbox_id: str, *, wait: float = 120.0, poll: float = 0.5, stop_on_divergence: bool = False
    ) -> ReviveReport:
        """Revives a rollout whose sandbox was lost (``410 sandbox_lost``, its node killed)
        and tells where it goes on: continue in ``report.sandbox`` from ``report.next_step``
        (the step above the last one the revived trajectory holds; steps the lost node
        answered but had not shipped yet are run again there).

        Through a gateway, a revive of a sandbox whose node does not answer yet is ``503
        node_unreachable`` until the gateway calls the node lost (a few seconds); it is asked
        again every ``poll`` seconds for at most ``wait`` seconds, then
        :class:`~warren.NodeUnreachable` is raised. Other errors are raised at once. The
        original, if its node comes back, is deleted there (it never runs a step beside its
        copy).
        """
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            try:
                return await self.revive(sandbox_id, stop_on_divergence=stop_on_divergence)
            except NodeUnreachable:
                if time.monotonic() + poll > deadline:
                    raise
                await asyncio.sleep(poll)

    async def list(self, labels: Optional[Mapping[str, str]] = None, state: Optional[str] = None) -> List[AsyncSandbox]:
        """The node's sandboxes (oldest first) that carry every label in ``labels`` and, when
        given, are in ``state`` (``"running"``, ``"stopped"``, ...)."""
        params: List[Tuple[str, str]] = [("label", f"{k}={v}") for k, v in (labels or {}).items()]
        if state is not None:
            params.append(("state", state))
        resp = await self._http.request("GET", "/v1/sandboxes", params=params, retry=True)
        return [AsyncSandbox(self, SandboxInfo.from_json(d)) for d in resp.json().get("sandboxes", [])]

    async def snapshots(self) -> List[Dict[str, Any]]:
        """The snapshots the caller may see (``GET /v1/snapshots``), oldest first."""
        resp = await self._http.request("GET", "/v1/snapshots", retry=True)
        return list(resp.json().get("snapshots", []))

    async def get_snapshot(self, snapshot_id: str) -> Dict[str, Any]:
        """One snapshot; :class:`NotFound` if there is none (or it is another tenant's)."""
        resp = await self._http.request("GET", f"/v1/snapshots/{quote(snapshot_id, safe='')}", retry=True)
        return dict(resp.json())

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Removes a snapshot; sandboxes made from it are not affected."""
        await self._http.request("DELETE", f"/v1/snapshots/{quote(snapshot_id, safe='')}")

    async def images(self) -> List[Dict[str, Any]]:
        """The node's images (``GET /v1/images``): dicts with ``reference``, ``layers`` (each
        with ``digest``, ``size_bytes``, ``source``, ...), ``stack``, ``size_bytes``."""
        resp = await self._http.request("GET", "/v1/images", retry=True)
        return list(resp.json().get("images", []))

    async def image(self, reference: str) -> Dict[str, Any]:
        """One image (``name[:tag]``) with its layers; :class:`NotFound` if there is none."""
        resp = await self._http.request("GET", f"/v1/images/{quote(reference, safe='')}", retry=True)
        return dict(resp.json())

    async def delete_image(self, reference: str) -> Dict[str, Any]:
        """Removes an image tag and collects the layers nothing else (no other image, no live
        sandbox) uses; returns ``{"reference", "gc": {"removed", "freed_bytes", "in_use"}}``."""
        resp = await self._http.request("DELETE", f"/v1/images/{quote(reference, safe='')}")
        return dict(resp.json())

    async def gc_images(self) -> Dict[str, Any]:
        """Collects every layer no image and no live sandbox references."""
        resp = await self._http.request("POST", "/v1/images/gc")
        return dict(resp.json())

    async def import_image(self, archive: str, tag: Optional[str] = None, *, force: bool = False) -> Dict[str, Any]:
        """Imports a ``docker save`` or OCI archive tar (a file on this machine, streamed to
        the node) as image ``tag`` (default: the archive's own name), ``POST
        /v1/images/import``. A tag that names an image already raises :class:`Conflict`
        unless ``force`` (sandboxes running on the old image keep it). Returns ``{"image",
        "converted", "reused", "bytes_read", "seconds"}``."""
        from ._build import _chunks

        f = open(archive, "rb")  # noqa: SIM115 -- closed by _chunks
        params: list = []
        if tag is not None:
            params.append(("tag", tag))
        if force:
            params.append(("force", "true"))
        resp = await self._http.request(
            "POST",
            "/v1/images/import",
            params=params,
            content=_chunks(f),
            timeout=self._http.call_timeout(None),
        )
        return dict(resp.json())

    async def pull_image(
        self,
        reference: str,
        tag: str,
        *,
        insecure: bool = False,
        username: Optional[str] = None,
        password: Optional[str] = None,
        force: bool = False,
    ) -> Dict[str, Any]:
        """Pulls ``host[:port]/repo[:tag|@digest]`` from an OCI registry onto the node as
        image ``tag`` (``POST /v1/images/pull``); ``insecure`` talks plain HTTP. A tag that
        exists raises :class:`Conflict` unless ``force``. Returns what :meth:`import_image`
        returns."""
        body: Dict[str, Any] = {"reference": reference, "tag": tag}
        if insecure:
            body["insecure"] = True
        if username is not None:
            body["username"] = username
            body["password"] = password or ""
        if force:
            body["force"] = True
        resp = await self._http.request("POST", "/v1/images/pull", json=body, timeout=self._http.call_timeout(None))
        return dict(resp.json())

    async def build_image(
        self,
        context: str,
        tag: str,
        *,
        dockerfile: Optional[str] = None,
        build_args: Optional[Mapping[str, str]] = None,
        target: Optional[str] = None,
        no_cache: bool = False,
        insecure: bool = False,
        network: Optional[str] = None,
        memory: Union[int, str, None] = None,
        cpus: Optional[float] = None,
        disk: Union[int, str, None] = None,
        step_timeout: Optional[float] = None,
        on_event: Optional[Callable[[Dict[str, Any]], None]] = None,
        log: bool = False,
    ) -> Dict[str, Any]:
        """Builds image ``tag`` from a Dockerfile (``POST /v1/images/build``).

        ``context`` is a directory (sent as a tar; ``.dockerignore`` applies on the node);
        ``dockerfile`` defaults to ``context/Dockerfile`` and may lie outside it. Every
        ``RUN`` runs in a sandbox of the node (``memory``, ``cpus``, ``disk`` and
        ``step_timeout`` bound each one; ``network="none"`` forbids the network). ``FROM`` may
        name a registry image (``host[:port]/repo:tag``), pulled once into the node's store
        (``insecure=True``: over plain HTTP). Each event
        of the build's log (dicts: ``step``, ``cached``, ``output``, ``step_done``, ...) goes
        to ``on_event`` as it comes; ``log=True`` prints them like ``warren image build``.
        Returns the image (as :meth:`image` does); a failed step raises
        :class:`~warren.BuildFailed` with the step, its exit status and its last output lines.
        """
        from ._build import build_image, print_event

        cb = on_event
        if log and on_event is None:
            cb = print_event
        return await build_image(
            self._http,
            context,
            tag,
            dockerfile=dockerfile,
            build_args=build_args,
            target=target,
            no_cache=no_cache,
            insecure=insecure,
            network=network,
            memory_mb=parse_mib(memory) if memory is not None else None,
            cpus=cpus,
            disk_mb=parse_mib(disk) if disk is not None else None,
            step_timeout=step_timeout,
            on_event=cb,
        )

    async def cluster(self) -> Dict[str, Any]:
        """The cluster as a gateway sees it (``GET /v1/cluster``, gateways only): ``nodes``
        (each with ``id``, ``address``, ``state`` -- ``ready``, ``draining`` or ``lost`` --,
        substrates, capacity and load), ``etcd_connected`` and ``revision``. Needs the admin
        role (``Forbidden`` otherwise): it shows every tenant's load and images."""
        resp = await self._http.request("GET", "/v1/cluster", retry=True)
        return dict(resp.json())

    async def drain(self, node: str) -> None:
        """Takes no new sandboxes on ``node``; its sandboxes keep running (gateways only)."""
        await self._http.request("POST", f"/v1/cluster/nodes/{quote(node, safe='')}/drain", retry=True)

    async def undrain(self, node: str) -> None:
        """Lets ``node`` take new sandboxes again (gateways only)."""
        await self._http.request("POST", f"/v1/cluster/nodes/{quote(node, safe='')}/undrain", retry=True)

    async def delete_all(
        self, labels: Optional[Mapping[str, str]] = None, state: Optional[str] = None, concurrency: int = 64
    ) -> int:
        """Deletes every sandbox :meth:`list` finds with these filters; returns how many.

        Without ``labels`` or ``state`` this deletes every sandbox on the node.
        """
        boxes = await self.list(labels=labels, state=state)
        sem = asyncio.Semaphore(max(1, concurrency))

        async def one(sb: AsyncSandbox) -> None:
            async with sem:
                await sb.delete()

        await asyncio.gather(*(one(sb) for sb in boxes))
        return len(boxes)

    async def aclose(self) -> None:
        """Closes the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
