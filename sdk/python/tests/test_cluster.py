"""The SDK against a cluster on loopback: a real 3-member etcd, two real gateways and simulated
nodes (``warren-simnode``: the node API and etcd membership of warrend, sandboxes in memory).
A gateway killed under load: the client fails over to the other one, and creates carrying an
idempotency key each yield exactly one sandbox. Needs no root; needs etcd and the built
binaries (``$WARREN_BIN_DIR``). Under ``CI=true`` anything missing fails instead of skipping.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import warren

REPO = Path(__file__).resolve().parents[3]
BIN_DIR = Path(os.environ.get("WARREN_BIN_DIR") or REPO / "target" / "release")


def _missing() -> Optional[str]:
    if not shutil.which("etcd") and not Path("/usr/bin/etcd").is_file():
        return "etcd is not installed (scripts/setup.sh installs etcd-server)"
    for b in ("warren-gateway", "warren-simnode"):
        if not (BIN_DIR / b).is_file():
            return f"{BIN_DIR / b} is missing: `cargo build --release --workspace --bins` or set WARREN_BIN_DIR"
    return None


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def _wait(what: str, check, limit: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} within {limit} s")


class _Cluster:
    def __init__(self, tmp: Path) -> None:
        self.procs: List[subprocess.Popen] = []
        self.tmp = tmp
        try:
            self._start()
        except BaseException:
            # Whatever was started before the failure must not outlive the test.
            self.close()
            raise

    def _start(self) -> None:
        tmp = self.tmp
        etcd = shutil.which("etcd") or "/usr/bin/etcd"
        ports = [(_free_port(), _free_port()) for _ in range(3)]
        initial = ",".join(f"m{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
        for i, (c, p) in enumerate(ports):
            self._spawn(
                f"etcd-m{i}",
                [
                    etcd,
                    "--name", f"m{i}",
                    "--data-dir", str(tmp / f"m{i}"),
                    f"--listen-client-urls=http://127.0.0.1:{c}",
                    f"--advertise-client-urls=http://127.0.0.1:{c}",
                    f"--listen-peer-urls=http://127.0.0.1:{p}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{p}",
                    f"--initial-cluster={initial}",
                    "--initial-cluster-state", "new",
                    "--initial-cluster-token", f"sdk-{os.getpid()}",
                ],
            )
        self.etcd = ",".join(f"http://127.0.0.1:{c}" for c, _ in ports)
        self.sim = self._spawn(
            "simnode",
            [str(BIN_DIR / "warren-simnode"), "--etcd", self.etcd, "--nodes", "4", "--node-prefix", "py", "--create-ms", "2"],
        )
        self.gateways = []
        for i in range(2):
            port = _free_port()
            proc = self._spawn(
                f"gw{i}", [str(BIN_DIR / "warren-gateway"), "--etcd", self.etcd, "--listen", f"127.0.0.1:{port}"]
            )
            self.gateways.append((proc, f"http://127.0.0.1:{port}"))
        for _, url in self.gateways:
            with warren.Client(url, max_retries=0) as c:
                _wait(f"gateway {url} sees 4 ready nodes", lambda: self.ready(c) == 4)

    @staticmethod
    def ready(c: warren.Client) -> int:
        return sum(1 for n in c.cluster()["nodes"] if n["state"] == "ready")

    def _spawn(self, name: str, argv: List[str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait(timeout=10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[_Cluster]:
    why = _missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot run under CI: {why}")
        pytest.skip(why)
    tmp = Path(tempfile.mkdtemp(prefix="warren-sdk-cluster-"))
    c = None
    try:
        c = _Cluster(tmp)
        yield c
    finally:
        if c is not None:
            c.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_cluster_view_and_drain(cluster: _Cluster) -> None:
    url = cluster.gateways[0][1]
    with warren.Client(url) as c:
        nodes = c.cluster()["nodes"]
        assert sorted(n["id"] for n in nodes) == ["py000", "py001", "py002", "py003"]
        c.drain("py001")
        _wait("py001 draining", lambda: {n["id"]: n["state"] for n in c.cluster()["nodes"]}["py001"] == "draining")
        ids = [c.create(memory=64, labels={"run": "drain"}).id for _ in range(20)]
        assert not [i for i in ids if i.startswith("py001-")], ids
        c.undrain("py001")
        _wait("py001 ready", lambda: {n["id"]: n["state"] for n in c.cluster()["nodes"]}["py001"] == "ready")
        c.delete_all(labels={"run": "drain"})


def test_a_gateway_killed_under_load_fails_over(cluster: _Cluster) -> None:
    (gw0, url0), (_, url1) = cluster.gateways
    run = f"fo{os.getpid()}"
    done = [0]
    lock = threading.Lock()
    with warren.Client([url0, url1], max_connections=64) as c:

        def work(i: int) -> str:
            sb = c.create(memory=64, labels={"run": run}, idempotency_key=f"{run}-{i}")
            assert c.get(sb.id).id == sb.id
            with lock:
                done[0] += 1
            return sb.id

        with ThreadPoolExecutor(16) as ex:
            futures = [ex.submit(work, i) for i in range(400)]
            _wait("100 creates done", lambda: done[0] >= 100)
            gw0.send_signal(signal.SIGKILL)
            ids = [f.result() for f in futures]  # none may fail: the client fails over
        assert len(set(ids)) == 400
        assert c.url == url1
        # One sandbox per idempotency key, however the retries went.
        assert len(c.list(labels={"run": run})) == 400
        c.delete_all(labels={"run": run})
        assert c.list(labels={"run": run}) == []
