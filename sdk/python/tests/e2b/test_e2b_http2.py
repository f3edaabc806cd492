"""E2B's SDK over HTTP/2: against a TLS endpoint its transport (pyqwest) lets ALPN choose the
version, and Warren offers ``h2``, so the control plane and envd's Connect RPCs (unary and
server-streaming) and file transfers all go over HTTP/2, as they do against E2B's cloud.

The SDK runs in a child process of its own with ``SSL_CERT_FILE`` naming the test's CA: the
SDK's transports are process-wide and read the trusted certificates once, when made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("e2b")

from e2b_helpers import free_port, need_e2b, node_name, start_node, stop_node  # noqa: E402

CHILD = r"""
import json, sys
from pyqwest import HTTPVersion, SyncRequest
from e2b import CommandExitException, Sandbox
from e2b.api.client_sync import get_pyqwest_transport

base = sys.argv[1]
out = {}
# The SDK's own shared transport, as its clients use it.
r = get_pyqwest_transport(None).execute_sync(SyncRequest("GET", base + "/v1/health"))
out["health"] = [r.status, str(r.http_version)]
out["h2"] = r.http_version == HTTPVersion.HTTP2
opts = {"api_url": base, "sandbox_url": base, "api_key": "e2b_warren_test"}
sb = Sandbox.create(timeout=120, metadata={"suite": "e2b-h2"}, **opts)
try:
    r = sb.commands.run("echo out; echo err >&2")
    out["run"] = [r.exit_code, r.stdout, r.stderr]
    seen = []
    sb.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    out["streamed"] = "".join(seen)
    try:
        sb.commands.run("exit 3")
    except CommandExitException as e:
        out["exit"] = e.exit_code
    big = bytes(range(256)) * 4096
    sb.files.write("/tmp/h2.bin", big)
    out["file"] = bytes(sb.files.read("/tmp/h2.bin", format="bytes")) == big
    out["listed"] = [e.name for e in sb.files.list("/tmp") if e.name == "h2.bin"]
    out["ids"] = [s.sandbox_id for s in Sandbox.list(**opts).next_items()] == [sb.sandbox_id]
finally:
    sb.kill()
json.dump(out, sys.stdout)
"""


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> None:
    """A CA, and a certificate for localhost it signs (openssl comes with ca-certificates)."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=warren-test-ca", cwd=d)
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "key.pem", "-out", "srv.csr", "-subj", "/CN=localhost", cwd=d)
    (d / "ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "cert.pem", "-days", "2", "-extfile", "ext", cwd=d)


def test_the_sdk_speaks_http2_to_a_tls_node():
    need_e2b()
    tmp = Path(tempfile.mkdtemp(prefix="warren-e2b-h2-"))
    certs = tmp / "certs"
    certs.mkdir()
    make_certs(certs)
    port = free_port()
    (tmp / "node").mkdir()
    node = start_node(
        tmp / "node",
        node_name("eh"),
        "--e2b",
        "--listen",
        f"127.0.0.1:{port}",
        "--tls-cert",
        str(certs / "cert.pem"),
        "--tls-key",
        str(certs / "key.pem"),
    )
    try:
        env = {**os.environ, "SSL_CERT_FILE": str(certs / "ca.pem")}
        env.pop("E2B_HTTP_VERSION", None)
        p = subprocess.run(
            [sys.executable, "-c", CHILD, f"https://localhost:{port}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, f"{p.stderr}\nnode log:\n{node.log_tail()}"
        got = json.loads(p.stdout)
        assert got["health"][0] == 200, got
        assert got["h2"], f"the SDK's transport did not negotiate HTTP/2: {got['health']}"
        assert got["run"] == [0, "out\n", "err\n"], got
        assert got["streamed"] == "1\n2\n3\n", got
        assert got["exit"] == 3, got
        assert got["file"] and got["listed"] == ["h2.bin"], got
        assert got["ids"], got
    finally:
        stop_node(node)
        shutil.rmtree(tmp, ignore_errors=True)
