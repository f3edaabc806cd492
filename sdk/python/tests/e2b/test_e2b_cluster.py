"""E2B's API through a gateway over two real nodes (one etcd member on loopback, two
``warrend --e2b --etcd``, one ``warren-gateway --e2b``): creates are placed on either node,
listings merge both, and every per-sandbox call (get, timeout, pause, connect, kill) reaches
the node that holds the sandbox through the gateway. Under ``CI=true`` anything missing
fails instead of skipping."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import pytest
import warren
from e2b_helpers import BIN_DIR, DOMAIN, E2bNode, free_port, need_e2b, start_e2b_node, stop_e2b_node


def _wait(what: str, check: Any, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} within {limit} s")


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: List[subprocess.Popen] = []
        self.nodes: List[E2bNode] = []
        c, p = free_port(), free_port()
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        self._spawn(
            "etcd",
            [
                etcd, "--name", "m0", "--data-dir", str(tmp / "etcd"),
                f"--listen-client-urls=http://127.0.0.1:{c}", f"--advertise-client-urls=http://127.0.0.1:{c}",
                f"--listen-peer-urls=http://127.0.0.1:{p}", f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                f"--initial-cluster=m0=http://127.0.0.1:{p}",
            ],
        )  # fmt: skip
        self.etcd = f"http://127.0.0.1:{c}"
        prefix = f"/warren-e2b-{secrets.token_hex(3)}"
        for i in range(2):
            d = tmp / f"node{i}"
            d.mkdir()
            self.nodes.append(start_e2b_node(d, "--etcd", self.etcd, "--etcd-prefix", prefix))
        gw_port = free_port()
        self._spawn(
            "gateway",
            [
                str(BIN_DIR / "warren-gateway"), "--etcd", self.etcd, "--etcd-prefix", prefix,
                "--listen", f"127.0.0.1:{gw_port}", "--e2b", "--e2b-domain", DOMAIN,
            ],
        )  # fmt: skip
        self.gateway = f"http://127.0.0.1:{gw_port}"
        with warren.Client(self.gateway, max_retries=0) as w:
            _wait("the gateway sees both nodes ready", lambda: self.ready(w) == 2)

    @staticmethod
    def ready(w: warren.Client) -> int:
        return sum(1 for n in w.cluster()["nodes"] if n["state"] == "ready")

    def opts(self) -> Dict[str, Any]:
        return {"api_url": self.gateway, "sandbox_url": self.gateway, "api_key": "k", "domain": DOMAIN}

    def _spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for n in self.nodes:
            stop_e2b_node(n)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    need_e2b()
    missing = [b for b in ("warren-gateway",) if not (BIN_DIR / b).is_file()]
    if not (shutil.which("etcd") or Path("/usr/bin/etcd").is_file()):
        missing.append("etcd (scripts/setup.sh installs etcd-server)")
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot run under CI: missing {missing}")
        pytest.skip(f"missing {missing}")
    tmp = Path(tempfile.mkdtemp(prefix="warren-e2b-cluster-"))
    c = None
    try:
        c = Cluster(tmp)
        yield c
    finally:
        if c is not None:
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_gateway_serves_e2b_over_both_nodes(cluster: Cluster) -> None:
    from e2b import NotFoundException, Sandbox, SandboxQuery

    run = secrets.token_hex(4)
    opts = cluster.opts()
    made = []
    with warren.Client(cluster.gateway, max_retries=0) as w:
        # One sandbox on each node: drain the other one while creating.
        for i, n in enumerate(cluster.nodes):
            other = cluster.nodes[1 - i].node.name
            w.drain(other)
            _wait(f"{other} draining", lambda: {x["id"]: x["state"] for x in w.cluster()["nodes"]}[other] == "draining")
            try:
                sb = Sandbox.create(timeout=120, metadata={"run": run}, **opts)
            finally:
                w.undrain(other)
                _wait(f"{other} ready", lambda: self_ready(w, other))
            assert sb.sandbox_id.startswith(n.node.name + "-")
            assert sb._envd_access_token
            made.append(sb)
    try:
        listed = Sandbox.list(query=SandboxQuery(metadata={"run": run}), **opts).next_items()
        assert sorted(s.sandbox_id for s in listed) == sorted(s.sandbox_id for s in made)
        for sb in made:
            # The data plane and sandbox ports through the gateway, to either node.
            assert sb.commands.run("echo via $0", cwd="/tmp").stdout == "via /bin/bash\n"
            sb.files.write("/srv/www/index.html", sb.sandbox_id)
            assert sb.files.read("/srv/www/index.html") == sb.sandbox_id
            server = sb.commands.run("cd /srv/www && exec python3 -m http.server 8000", background=True)
            try:
                r = _port_get(cluster.gateway + "/index.html", {"Host": sb.get_host(8000)})
                assert (r.status_code, r.text) == (200, sb.sandbox_id)
                heads = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "8000"}
                r = httpx.get(cluster.gateway + "/index.html", headers=heads, timeout=10)
                assert (r.status_code, r.text) == (200, sb.sandbox_id)
            finally:
                server.kill()
            info = Sandbox.get_info(sb.sandbox_id, **opts)
            assert info.metadata == {"run": run} and info.state == "running"
            Sandbox.set_timeout(sb.sandbox_id, 600, **opts)
            assert sb.pause() is True
            assert Sandbox.get_info(sb.sandbox_id, **opts).state == "paused"
            again = Sandbox.connect(sb.sandbox_id, **opts)
            assert again._envd_access_token == sb._envd_access_token
            assert Sandbox.get_info(sb.sandbox_id, **opts).state == "running"
        # A sandbox id of a node the cluster never saw: E2B's not-found.
        with pytest.raises(NotFoundException):
            Sandbox.get_info("nowhere-01jzzzzzzzzzzzzzzzzzzzzzzz", **opts)
    finally:
        for sb in made:
            assert Sandbox.kill(sb.sandbox_id, **opts) is True
    assert Sandbox.list(query=SandboxQuery(metadata={"run": run}), **opts).next_items() == []


def _port_get(url: str, headers: Dict[str, str]) -> httpx.Response:
    """GET through a sandbox port, retrying while the server inside starts (502 until then)."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(url, headers=headers, timeout=10)
        if r.status_code != 502 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def self_ready(w: warren.Client, node: str) -> bool:
    return {x["id"]: x["state"] for x in w.cluster()["nodes"]}[node] == "ready"
