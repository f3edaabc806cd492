"""``sandbox.get_host(port)`` through E2B's SDK: a server listening inside a Warren sandbox
(``python3 -m http.server``) is reached by host routing (``{port}-{id}.{--e2b-domain}``, the
name the SDK builds) and by header routing (``E2b-Sandbox-Id``/``E2b-Sandbox-Port``), both
over Warren's port proxy; a port nothing listens on answers 502 with a message."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from e2b_helpers import DOMAIN

pytest.importorskip("e2b")

PORT = 8000


def _serve(sb: Any) -> Any:
    """Starts ``python3 -m http.server`` on PORT inside ``sb``, serving one file."""
    sb.files.write("/srv/www/index.html", "hello from inside\n")
    return sb.commands.run(f"cd /srv/www && exec python3 -m http.server {PORT}", background=True)


def _get(base: str, path: str, headers: dict) -> httpx.Response:
    """GETs ``path`` from the node with ``headers``, retrying while the server starts (the
    port proxy answers 502 until something listens)."""
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(base + path, headers=headers, timeout=10)
        if r.status_code != 502 or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_get_host_reaches_an_http_server_inside(e2b_sandbox: Any, e2b_node: Any) -> None:
    server = _serve(e2b_sandbox)
    try:
        host = e2b_sandbox.get_host(PORT)
        assert host == f"{PORT}-{e2b_sandbox.sandbox_id}.{DOMAIN}"
        # Host routing: the name get_host answers, sent to the node (its --e2b-domain).
        r = _get(e2b_node.base, "/index.html", {"Host": host})
        assert r.status_code == 200, r.text
        assert r.text == "hello from inside\n"
        assert r.headers.get("warren-port") == str(PORT)
        # The bare `/` (the directory's index.html) with a query string passes through too.
        r = httpx.get(e2b_node.base + "/?x=1", headers={"Host": host}, timeout=10)
        assert r.status_code == 200 and r.text == "hello from inside\n"
        # Header routing: the same server named by headers, whatever the host.
        heads = {"E2b-Sandbox-Id": e2b_sandbox.sandbox_id, "E2b-Sandbox-Port": str(PORT)}
        r = httpx.get(e2b_node.base + "/index.html", headers=heads, timeout=10)
        assert r.status_code == 200 and r.text == "hello from inside\n"
        # A missing file is the server's own 404, not Warren's.
        r = httpx.get(e2b_node.base + "/nope", headers={"Host": host}, timeout=10)
        assert r.status_code == 404 and r.headers.get("warren-port") == str(PORT)
    finally:
        server.kill()


def test_a_port_nothing_listens_on_is_502(e2b_sandbox: Any, e2b_node: Any) -> None:
    host = e2b_sandbox.get_host(9)
    r = httpx.get(e2b_node.base + "/", headers={"Host": host}, timeout=10)
    assert r.status_code == 502
    assert "9" in r.text and "warren-port" not in r.headers


def test_a_host_of_no_sandbox_is_not_found(e2b_node: Any) -> None:
    ghost = f"{e2b_node.node.name}-01jzzzzzzzzzzzzzzzzzzzzzzz"
    r = httpx.get(e2b_node.base + "/", headers={"Host": f"{PORT}-{ghost}.{DOMAIN}"}, timeout=10)
    assert r.status_code == 404
    r = httpx.get(e2b_node.base + "/", headers={"Host": f"{PORT}-not-an-id.{DOMAIN}"}, timeout=10)
    assert r.status_code == 404
    r = httpx.get(e2b_node.base + "/", headers={"E2b-Sandbox-Id": ghost, "E2b-Sandbox-Port": "99999"}, timeout=10)
    assert r.status_code == 400
