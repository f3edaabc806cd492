"""What an attacker sends to the E2B front of a real node, byte for byte with ``httpx``: every
malformed request is refused in the protocol's own shape (E2B's ``{code, message}`` with the
HTTP status as ``code``; Connect's error JSON, or its end-of-stream message for streams), never
a 5xx; a sandbox id in a control path is an id, not a path into other routes; and envd's file
routes resolve a symlink the sandbox planted inside the sandbox, never on the node."""

from __future__ import annotations

import json
import os
import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List

import httpx
import pytest
from e2b_helpers import E2bNode

CT_JSON = {"Content-Type": "application/json"}
CT_STREAM = {"Content-Type": "application/connect+json"}


def e2b_error(r: httpx.Response, status: int) -> Dict[str, Any]:
    """An E2B-shaped refusal with this status."""
    assert r.status_code == status, f"{r.status_code} {r.text[:300]}"
    v = r.json()
    assert v["code"] == status and isinstance(v["message"], str), v
    return v


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def messages(r: httpx.Response) -> List[Any]:
    """The messages of a streamed Connect answer (200), each as (flags, JSON)."""
    assert r.status_code == 200, f"{r.status_code} {r.text[:300]}"
    b = r.content
    out = []
    while len(b) >= 5:
        flags, n = struct.unpack(">BI", b[:5])
        out.append((flags, json.loads(b[5 : 5 + n])))
        b = b[5 + n :]
    assert b == b"", "a partial envelope at the end"
    return out


def end_of_stream(r: httpx.Response) -> Dict[str, Any]:
    """The end-of-stream message of a streamed Connect answer, which comes last."""
    msgs = messages(r)
    assert msgs and msgs[-1][0] & 0x02, msgs
    return msgs[-1][1]


@pytest.fixture(scope="module")
def sandbox(e2b_node: E2bNode) -> Iterator[str]:
    r = httpx.post(
        f"{e2b_node.base}/v2/sandboxes",
        json={"templateID": "base", "timeout": 300, "metadata": {"suite": "e2b-malformed"}},
        headers={"X-API-Key": "e2b_warren_test"},
    )
    assert r.status_code == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        yield sid
    finally:
        httpx.delete(f"{e2b_node.base}/sandboxes/{sid}", headers={"X-API-Key": "e2b_warren_test"})


def envd(n: E2bNode, sid: str, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"E2b-Sandbox-Id": sid, **kw.pop("headers", {})}
    return httpx.request(method, n.base + path, headers=headers, timeout=60, **kw)


def run(n: E2bNode, sid: str, cmd: str) -> None:
    """Runs `sh -c cmd` in the sandbox through envd and checks it exited 0."""
    msg = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}, "stdin": False})
    r = envd(n, sid, "POST", "/process.Process/Start", headers=CT_STREAM, content=envelope(msg.encode()))
    ends = [m["event"]["end"] for _, m in messages(r) if "end" in m.get("event", {})]
    assert ends and ends[0].get("exitCode", 0) == 0, r.content
    assert end_of_stream(r) == {}, r.content


def test_control_plane_refusals_are_e2b_shaped(e2b_node: E2bNode, sandbox: str) -> None:
    base, key = e2b_node.base, {"X-API-Key": "e2b_warren_test"}
    bodies: List[bytes] = [
        b"{",
        b"[]",
        b"null",
        b'{"templateID": 7}',
        b'{"templateID": "base", "timeout": -5}',
        b'{"templateID": "base", "timeout": 1e30}',
        b'{"templateID": "base", "timeout": 99999999999999999999}',
        b'{"templateID": "base", "timeout": "60"}',
        b'{"templateID": "base", "envVars": {"A\\u0000B": "x"}}',
        b'{"templateID": "base", "envVars": {"A": "x\\u0000y"}}',
        b'{"templateID": "base", "metadata": {"k": 1}}',
        b'{"templateID": "\\u0000"}',
        b"\xff\xfe\x00garbage",
    ]
    for body in bodies:
        r = httpx.post(f"{base}/v2/sandboxes", content=body, headers={**key, **CT_JSON})
        assert 400 <= r.status_code < 500, f"{body!r}: {r.status_code} {r.text[:300]}"
        e2b_error(r, r.status_code)
    for template in ["../../etc/passwd", "no-such-template-" + uuid.uuid4().hex[:8]]:
        r = httpx.post(f"{base}/v2/sandboxes", json={"templateID": template}, headers=key)
        assert 400 <= r.status_code < 500, f"{template}: {r.status_code} {r.text[:300]}"
        e2b_error(r, r.status_code)
    # A decoded `/` or `?` in an id reaches no other route.
    spliced = f"{sandbox}%2Ffiles%3Fpath%3D%2Fetc%2Fhostname"
    for method, path in [
        ("GET", f"/sandboxes/{spliced}"),
        ("DELETE", f"/sandboxes/{spliced}"),
        ("POST", f"/sandboxes/{spliced}/timeout"),
        ("POST", f"/v2/sandboxes/{spliced}/connect"),
    ]:
        e2b_error(httpx.request(method, base + path, headers=key, json={"timeout": 60}), 404)
    e2b_error(httpx.get(f"{base}/sandboxes/%FF%FE", headers=key), 400)
    for t in [-1, 0, 10**30, "x"]:
        r = httpx.post(f"{base}/sandboxes/{sandbox}/timeout", json={"timeout": t}, headers=key)
        e2b_error(r, 400)
    e2b_error(httpx.post(f"{base}/v2/sandboxes", content=b"{" + b" " * (3 << 20), headers=key), 413)
    # The sandbox is still there, untouched.
    assert httpx.get(f"{base}/sandboxes/{sandbox}", headers=key).status_code == 200


def test_connect_frames_that_do_not_parse_are_connect_errors(e2b_node: E2bNode, sandbox: str) -> None:
    n = e2b_node
    start = b'{"process": {"cmd": "true"}, "stdin": false}'
    cases = [
        (envelope(start)[:7], "invalid_argument"),  # truncated inside a message
        (b"\x00\x00", "invalid_argument"),  # truncated inside a header
        (b"\x00\xff\xff\xff\xff", "resource_exhausted"),  # a length over the limit
        (envelope(start, flags=0x01), "internal"),  # compressed, none negotiated
        (envelope(b"{}", flags=0x02), "invalid_argument"),  # end-of-stream from a client
        (envelope(start, flags=0x80), "invalid_argument"),  # unknown flags
        (envelope(start) + envelope(start), "invalid_argument"),  # two requests
        (envelope(b"{\"process\": 7}"), "invalid_argument"),  # wrong types
        (envelope(b"\xff\xfe"), "invalid_argument"),  # not UTF-8
        (b"", "invalid_argument"),  # no message at all
    ]
    for body, code in cases:
        r = envd(n, sandbox, "POST", "/process.Process/Start", headers=CT_STREAM, content=body)
        end = end_of_stream(r)
        assert end.get("error", {}).get("code") == code, f"{body[:20]!r}: {end}"
    # Unary: bad content types, bodies and compression answer Connect's error JSON.
    for headers, body, status, code in [
        ({"Content-Type": "text/plain"}, b"{}", 400, "invalid_argument"),
        ({}, b"{}", 400, "invalid_argument"),
        (CT_JSON, b"{", 400, "invalid_argument"),
        (CT_JSON, b'{"path": 7}', 400, "invalid_argument"),
        (CT_JSON, b'{"path": "/a\\u0000b"}', 400, "invalid_argument"),
        (CT_JSON, b'{"path": "/../../.."}', 400, "invalid_argument"),
        ({**CT_JSON, "Content-Encoding": "gzip"}, b"\x1f\x8b", 501, "unimplemented"),
        ({"Content-Type": "application/proto"}, b"\xff\xff\xff", 400, "invalid_argument"),
        ({**CT_JSON, "Connect-Protocol-Version": "2"}, b"{}", 400, "invalid_argument"),
    ]:
        r = envd(n, sandbox, "POST", "/filesystem.Filesystem/Stat", headers=headers, content=body)
        assert r.status_code == status, f"{headers} {body!r}: {r.status_code} {r.text[:300]}"
        assert r.json()["code"] == code, r.text
    r = envd(n, sandbox, "POST", "/filesystem.Filesystem/NoSuchMethod", headers=CT_JSON, content=b"{}")
    assert r.status_code == 501 and r.json()["code"] == "unimplemented", r.text
    r = envd(n, sandbox, "POST", "/filesystem.Filesystem/ListDir", headers=CT_JSON, content=b'{"path": "/etc", "depth": 4294967295}')
    assert r.status_code < 500, r.text[:300]
    r = envd(n, sandbox, "GET", "/process.Process/List")
    assert r.status_code == 501 and r.json()["code"] == "unimplemented", r.text


def test_files_resolve_symlinks_inside_the_sandbox(e2b_node: E2bNode, sandbox: str) -> None:
    n = e2b_node
    # A file on the node that the sandbox names through a planted symlink.
    d = Path(tempfile.mkdtemp(prefix="warren-e2b-host-"))
    secret = d / "secret"
    marker = "node-only-" + uuid.uuid4().hex
    secret.write_text(marker)
    try:
        run(n, sandbox, f"mkdir -p /tmp/in && ln -sfn {secret} /tmp/in/link && ln -sfn {d} /tmp/in/dir"
                        f" && ln -sfn /proc/self/environ /tmp/in/env")
        for path in ["/tmp/in/link", "/tmp/in/dir/secret", "/tmp/in/env"]:
            r = envd(n, sandbox, "GET", "/files", params={"path": path})
            assert r.status_code < 500, f"{path}: {r.status_code} {r.text[:300]}"
            assert marker not in r.text, f"{path} read the node's file"
            if r.status_code != 200:
                v = r.json()
                assert v["code"] == r.status_code and isinstance(v["message"], str), v
        # Writing through the planted link writes inside the sandbox, never the node's file.
        r = envd(n, sandbox, "POST", "/files", params={"path": "/tmp/in/link"}, content=b"overwritten",
                 headers={"Content-Type": "application/octet-stream"})
        assert r.status_code < 500, r.text[:300]
        assert secret.read_text() == marker
        r = envd(n, sandbox, "POST", "/filesystem.Filesystem/Stat", headers=CT_JSON,
                 content=json.dumps({"path": "/tmp/in/dir/secret"}).encode())
        assert r.status_code == 404 and r.json()["code"] == "not_found", r.text
        # Paths that are not paths.
        for params in [{"path": "/a\x00b"}, {"path": ""}, {}, {"path": "/../../.."}]:
            r = envd(n, sandbox, "GET", "/files", params=params)
            assert 400 <= r.status_code < 500, f"{params}: {r.status_code} {r.text[:300]}"
            assert r.json()["code"] == r.status_code, r.text
        r = envd(n, sandbox, "POST", "/files", params={"path": "/tmp/x\x00y"}, content=b"x")
        assert 400 <= r.status_code < 500 and r.json()["code"] == r.status_code, r.text
        r = envd(n, sandbox, "POST", "/files", content=b"--nope\r\n",
                 headers={"Content-Type": "multipart/form-data; boundary=nope"})
        assert 400 <= r.status_code < 500 and r.json()["code"] == r.status_code, r.text
    finally:
        secret.unlink()
        os.rmdir(d)
