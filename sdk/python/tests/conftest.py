"""Fixtures: a private ``warrend`` for the session, clients, and sandboxes.

The node is started from ``$WARREN_BIN_DIR`` (default ``<repo>/target/release``) with its own
socket, state directory and node name, and stopped (SIGTERM) at the end after its sandboxes
are deleted. Tests that need it are skipped, with the reason, when not root or when the
binaries are missing; the unit tests run anywhere.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator, Iterator, List, Optional

import httpx
import pytest

import warren

# The E2B compatibility tests' fixtures live beside them in e2b/e2b_fixtures.py, registered here:
# a second conftest.py there would replace this module in sys.modules, and every
# `from conftest import ...` collected after it would fail.
sys.path.insert(0, str(Path(__file__).resolve().parent / "e2b"))
pytest_plugins = ["e2b_fixtures"]

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("WARREN_BIN_DIR") or REPO / "target" / "release")
SMALL = 64  # MiB per test sandbox


class Node:
    """A running warrend of this test session."""

    def __init__(self, proc: subprocess.Popen, url: str, name: str, tmp: Path, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.name = name
        self.tmp = tmp
        self.log = log
        self.http_url = ""  # set when the node also listens on loopback TCP

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _why_not() -> Optional[str]:
    if sys.platform != "linux":
        return "warrend runs on Linux only"
    if os.geteuid() != 0:
        return "the live tests start warrend, which needs root (run as root, e.g. scripts/test.sh)"
    for b in ("warrend", "warren-agent"):
        if not (BIN_DIR / b).is_file():
            return (
                f"{BIN_DIR / b} is missing: build it with "
                "`cargo build --release -p warrend -p warren-agent` or set WARREN_BIN_DIR"
            )
    return None


def start_node(tmp: Path, name: str, *extra: str) -> Node:
    """Starts a warrend on a socket under ``tmp`` and waits for its health check."""
    sock = tmp / "warren.sock"
    log = tmp / "warrend.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen(
            [
                str(BIN_DIR / "warrend"),
                "--socket",
                str(sock),
                "--state-dir",
                str(tmp / "state"),
                "--node",
                name,
                *extra,
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")},
        )
    node = Node(proc, f"unix://{sock}", name, tmp, log)
    deadline = time.monotonic() + 30
    transport = httpx.HTTPTransport(uds=str(sock))
    with httpx.Client(transport=transport, base_url="http://warren", timeout=2) as http:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"warrend exited with {proc.returncode} at start:\n{node.log_tail()}")
            try:
                if sock.exists() and http.get("/v1/health").status_code == 200:
                    return node
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                stop_node(node)
                raise RuntimeError(f"warrend did not answer /v1/health within 30 s:\n{node.log_tail()}")
            time.sleep(0.05)


def stop_node(node: Node) -> None:
    """Deletes the node's sandboxes, then stops it with SIGTERM (SIGKILL after 30 s)."""
    if node.proc.poll() is None:
        try:
            with warren.Client(node.url) as c:
                c.delete_all()
        except Exception as e:  # the node may be broken; still stop it
            print(f"cleanup of {node.name} failed: {e}", file=sys.stderr)
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(30)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(10)
    remove_node_cgroups(node.name)
    shutil.rmtree(node.tmp, ignore_errors=True)


def remove_node_cgroups(name: str) -> None:
    """Removes the node's own cgroup directories once empty.

    warrend leaves its per-node parent cgroup (``warren-<node>`` in every hierarchy) behind
    when it stops; with a fresh node name per test run these would pile up on the host.
    ``rmdir`` only succeeds on an empty cgroup, so nothing in use is touched.
    """
    root = Path("/sys/fs/cgroup")
    for d in [root / f"warren-{name}", *root.glob(f"*/warren-{name}")]:
        try:
            d.rmdir()
        except OSError:
            pass


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_name(prefix: str = "py") -> str:
    return prefix + secrets.token_hex(4)


@pytest.fixture(scope="session")
def node() -> Iterator[Node]:
    """The session's own warrend."""
    why = _why_not()
    if why:
        pytest.skip(why)
    tmp = Path(tempfile.mkdtemp(prefix="warren-py-"))
    # The example network configuration the README points at, so its `pypi` examples run.
    net = REPO / "docs" / "examples" / "network.toml"
    # Also on loopback TCP, for clients of other protocols (SandboxFusion's use `requests`).
    port = free_port()
    n = start_node(
        tmp, node_name(), "--max-sandboxes", "2000", "--network-config", str(net), "--listen", f"127.0.0.1:{port}"
    )
    n.http_url = f"http://127.0.0.1:{port}"
    try:
        yield n
    finally:
        stop_node(n)


@pytest.fixture(scope="session")
def url(node: Node) -> str:
    """The session node's URL (``unix:///...``)."""
    return node.url


@pytest.fixture
async def aclient(url: str) -> AsyncIterator[warren.AsyncClient]:
    """An AsyncClient bound to this test's event loop."""
    async with warren.AsyncClient(url) as c:
        yield c


@pytest.fixture(scope="session")
def client(url: str) -> Iterator[warren.Client]:
    """A blocking client for the whole session."""
    with warren.Client(url) as c:
        yield c


@pytest.fixture
async def asb(aclient: warren.AsyncClient) -> AsyncIterator[warren.AsyncSandbox]:
    """A small sandbox for one test, deleted afterwards."""
    async with await aclient.create(memory=SMALL, labels={"suite": "py"}) as sb:
        yield sb


@pytest.fixture
def sb(client: warren.Client) -> Iterator[warren.Sandbox]:
    """A small sandbox (blocking API) for one test, deleted afterwards."""
    with client.create(memory=SMALL, labels={"suite": "py"}) as s:
        yield s


def agent_pids(sandbox_id: str) -> List[int]:
    """Host pids of processes in the sandbox's cgroup (the agent among them)."""
    pids = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if f"/{sandbox_id}" in (p / "cgroup").read_text():
                pids.append(int(p.name))
        except OSError:
            continue
    return pids


def need(module: str, why: str = "scripts/test.sh installs it from sdk/python/constraints.txt"):  # type: ignore[no-untyped-def]
    """Imports an upstream package a compatibility test runs against: skipped when missing,
    failed when missing under CI (where the suite's set-up installs it)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{module} is not installed ({why}): {e}")
        pytest.skip(f"{module} is not installed ({why})")
