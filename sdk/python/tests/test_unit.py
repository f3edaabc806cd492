"""Tests that need no node: parsing, error mapping, retry policy, the sync wrapper."""

from __future__ import annotations

import inspect
import os
import pickle
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import httpx
import pytest

import warren
from warren._models import SandboxInfo
from warren._sandboxes import AsyncSandbox
from warren._transport import _parse_url


def test_parse_mib() -> None:
    assert warren.parse_mib(64) == 64
    assert warren.parse_mib("512M") == 512
    assert warren.parse_mib("512MiB") == 512
    assert warren.parse_mib("1G") == 1024
    assert warren.parse_mib("1.5GiB") == 1536
    assert warren.parse_mib("2gb") == 2048
    assert warren.parse_mib("65536K") == 64
    assert warren.parse_mib("1T") == 1024 * 1024
    assert warren.parse_mib(None) is None
    for bad in ["", "lots", "12X", "-5M", "0.1K", True, 0, -3]:
        with pytest.raises(ValueError):
            warren.parse_mib(bad)  # type: ignore[arg-type]


def test_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARREN_URL", raising=False)
    assert _parse_url(None) == ("http://warren", "/run/warren/warren.sock")
    assert _parse_url("unix:///tmp/x.sock") == ("http://warren", "/tmp/x.sock")
    assert _parse_url("/tmp/y.sock") == ("http://warren", "/tmp/y.sock")
    assert _parse_url("http://127.0.0.1:7070/") == ("http://127.0.0.1:7070", None)
    monkeypatch.setenv("WARREN_URL", "http://10.0.0.1:80")
    assert _parse_url(None) == ("http://10.0.0.1:80", None)
    assert warren.AsyncClient().url == "http://10.0.0.1:80"
    for bad in ["ftp://x", "unix://relative", "localhost:80"]:
        with pytest.raises(ValueError):
            _parse_url(bad)


CODES = {
    "invalid_request": (warren.InvalidRequest, 400),
    "invalid_path": (warren.InvalidPath, 400),
    "not_found": (warren.NotFound, 404),
    "invalid_state": (warren.InvalidState, 409),
    "conflict": (warren.Conflict, 409),
    "limit_exceeded": (warren.LimitExceeded, 429),
    "busy": (warren.Busy, 429),
    "timeout": (warren.Timeout, 504),
    "unsupported_substrate": (warren.UnsupportedSubstrate, 501),
    "start_failed": (warren.StartFailed, 502),
    "sandbox_lost": (warren.SandboxLost, 502),
    "file_error": (warren.FileError, 422),
    "internal": (warren.ServerError, 500),
    "unauthorized": (warren.Unauthorized, 401),
    "forbidden": (warren.Forbidden, 403),
    "quota_exceeded": (warren.QuotaExceeded, 429),
}


@pytest.mark.parametrize("code", sorted(CODES))
def test_error_codes_map_to_classes(code: str) -> None:
    cls, status = CODES[code]
    body = {"error": {"code": code, "message": "m", "retry_after": 3}}
    e = warren._errors.error_from_body(status, body)
    assert type(e) is cls
    assert isinstance(e, warren.WarrenError)
    assert (e.code, e.message, e.status, e.retry_after) == (code, "m", status, 3.0)
    assert str(e) == f"{code}: m"
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls and back.code == code and back.retry_after == 3.0


def test_error_hierarchy_and_fallbacks() -> None:
    assert issubclass(warren.InvalidPath, warren.InvalidRequest)
    assert issubclass(warren.InvalidState, warren.Conflict)
    assert issubclass(warren.UnsupportedSubstrate, warren.Unsupported)
    assert issubclass(warren.Timeout, TimeoutError)
    assert issubclass(warren.ConnectionError, ConnectionError)
    f = warren._errors.error_from_body
    assert type(f(404, {"error": {"code": "brand_new", "message": "x"}})) is warren.NotFound
    assert type(f(503, "<html>bad gateway</html>")) is warren.ServerError
    assert type(f(418, None)) is warren.WarrenError
    e = f(429, {"error": {"code": "busy", "message": "full"}}, "7")
    assert e.retry_after == 7.0
    assert f(500, {}).message == "HTTP 500"


def test_exec_body_shapes() -> None:
    from warren._exec import _exec_body

    assert _exec_body("echo hi", None, None, None, None, None, None) == {"shell": "echo hi"}
    body = _exec_body(["ls", "-l"], "/tmp", {"A": "1"}, b"in", "root", 1.5, 100)
    assert body == {
        "argv": ["ls", "-l"],
        "cwd": "/tmp",
        "env": {"A": "1"},
        "stdin": "aW4=",
        "stdin_encoding": "base64",
        "timeout_secs": 1.5,
        "max_output_bytes": 100,
        "user": "root",
    }
    assert _exec_body("sleep 1 &", None, None, None, None, None, None, kill_tree=True) == {
        "shell": "sleep 1 &",
        "kill_tree": True,
    }
    # Any bytes go as base64; text goes as it is.
    assert _exec_body("cat", None, None, b"\xff\x00", None, None, None)["stdin"] == "/wA="
    assert _exec_body("cat", None, None, "t\u00e9", None, None, None)["stdin"] == "t\u00e9"
    with pytest.raises(TypeError):
        _exec_body(b"ls", None, None, None, None, None, None)  # type: ignore[arg-type]


def _mock(client: warren.AsyncClient, handler: Callable[[httpx.Request], httpx.Response]) -> None:
    client._http.targets[0].client = httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://warren")


INFO = {
    "id": "n1-01jd0m7x4e8k0k9yq1w2e3r4t5",
    "substrate": "container",
    "state": "running",
    "image": ["default"],
    "limits": {"cpus": 1.0, "memory_mb": 64, "disk_mb": 1024, "pids": 512},
    "labels": {},
    "env": {},
    "workdir": None,
    "user": None,
    "network": "none",
    "created_at_ms": 1,
    "expires_at_ms": None,
    "idle_timeout_secs": None,
    "last_activity_ms": 1,
    "reason": None,
    "idempotency_key": "k",
    "future_field": 1,
}
BUSY = {"error": {"code": "busy", "message": "saturated", "retry_after": 0}}


async def test_safe_calls_retry_on_busy_and_transport_errors() -> None:
    calls: List[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(429, json=BUSY)
        return httpx.Response(200, json=INFO)

    c = warren.AsyncClient("unix:///nonexistent.sock")
    _mock(c, handler)
    sb = await c.get(INFO["id"])
    assert sb.id == INFO["id"] and len(calls) == 3
    assert sb.info.extra == {"future_field": 1}
    calls.clear()
    sb2 = await c.create(memory="64M", idempotency_key="k")
    assert sb2.id == INFO["id"] and calls == ["POST"] * 3


async def test_retry_after_is_honoured() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        if n == 1:
            return httpx.Response(429, json={"error": {"code": "busy", "message": "m", "retry_after": 0.3}})
        return httpx.Response(200, json={"status": "ok", "node": "n1", "version": "0", "substrates": ["container"]})

    c = warren.AsyncClient("unix:///nonexistent.sock")
    _mock(c, handler)
    t0 = time.monotonic()
    h = await c.health()
    assert h.node == "n1" and time.monotonic() - t0 >= 0.3


async def test_unsafe_calls_are_not_retried() -> None:
    calls: List[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if req.url.path == "/v1/sandboxes/" + INFO["id"]:
            return httpx.Response(200, json=INFO)
        if req.url.path.endswith("/exec"):
            raise httpx.ReadError("connection reset")
        return httpx.Response(429, json=BUSY)

    c = warren.AsyncClient("unix:///nonexistent.sock", max_retries=3)
    _mock(c, handler)
    with pytest.raises(warren.Busy) as ei:
        await c.create()  # no idempotency key: never retried
    assert ei.value.retry_after == 0 and ei.value.status == 429
    sb = await c.get(INFO["id"])
    calls.clear()
    with pytest.raises(warren.ConnectionError):
        await sb.exec("true")
    with pytest.raises(warren.Busy):
        await sb.spawn("sleep 1")
    with pytest.raises(warren.Busy):
        await sb.files.write("/x", b"1")
    assert len(calls) == 3


async def test_retries_give_up() -> None:
    n = 0

    def handler(req: httpx.Request) -> httpx.Response:
        nonlocal n
        n += 1
        raise httpx.ConnectError("refused")

    c = warren.AsyncClient("unix:///nonexistent.sock", max_retries=2, restart_wait=0)
    _mock(c, handler)
    with pytest.raises(warren.ConnectionError) as ei:
        await c.health()
    assert n == 3 and ei.value.code == "connection" and ei.value.status is None
    assert "restart_wait" not in str(ei.value)


async def test_unreachable_node_is_a_connection_error() -> None:
    async with warren.AsyncClient("unix:///nonexistent/warren.sock", max_retries=0, restart_wait=0) as c:
        with pytest.raises(warren.ConnectionError):
            await c.health()
    with warren.Client("unix:///nonexistent/warren.sock", max_retries=0, restart_wait=0) as sc:
        with pytest.raises(warren.ConnectionError):
            sc.health()


def _public_methods(cls: type) -> List[str]:
    return [n for n, v in vars(cls).items() if not n.startswith("_") and callable(v)]


@pytest.mark.parametrize(
    "sync_cls,async_cls",
    [
        (warren.Client, warren.AsyncClient),
        (warren.Sandbox, warren.AsyncSandbox),
        (warren.Files, warren.AsyncFiles),
        (warren.Process, warren.AsyncProcess),
        (warren.Pty, warren.AsyncPty),
    ],
)
def test_sync_api_is_made_from_the_async_one(sync_cls: type, async_cls: type) -> None:
    for name in _public_methods(async_cls):
        if name == "aclose":
            continue
        assert hasattr(sync_cls, name), f"{sync_cls.__name__} lacks {name}"
        s, a = getattr(sync_cls, name), getattr(async_cls, name)
        assert s.__doc__ == a.__doc__, name
        assert inspect.signature(s).parameters.keys() == inspect.signature(a).parameters.keys(), name


def test_every_public_name_has_a_docstring() -> None:
    for name in warren.__all__:
        obj: Any = getattr(warren, name)
        if name.startswith("__") or name in ("DEFAULT_URL", "Command"):
            continue
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, v in vars(obj).items():
                if attr.startswith("_") or not (callable(v) or isinstance(v, property)):
                    continue
                assert inspect.getdoc(v), f"{name}.{attr}"


async def test_list_pages_through_a_directory() -> None:
    names = ["f%03d" % i for i in range(25)]
    seen: List[Dict[str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        q = dict(req.url.params)
        seen.append(q)
        after = q.get("after")
        rest = [n for n in names if after is None or n > after][:10]
        body: Dict[str, Any] = {
            "entries": [
                {"name": n, "kind": "file", "size": 0, "mode": 420, "uid": 0, "gid": 0, "mtime_ms": 0} for n in rest
            ]
        }
        if rest and rest[-1] != names[-1]:
            body["next"] = rest[-1]
        return httpx.Response(200, json=body)

    c = warren.AsyncClient("unix:///nonexistent.sock")
    _mock(c, handler)
    sb = AsyncSandbox(c, SandboxInfo.from_json(INFO))
    got = await sb.files.list("/d")
    assert [f.name for f in got] == names
    assert [q.get("after") for q in seen] == [None, "f009", "f019"]
    entries, nxt = await sb.files.list_page("/d", limit=10)
    assert len(entries) == 10 and nxt == "f009" and seen[-1]["limit"] == "10"


def test_binary_results_keep_the_bytes() -> None:
    d = {"exit_code": 0, "stdout": "/wA=", "stderr": "", "encoding": "base64"}
    r = warren.ExecResult.from_json(d, binary=True)
    assert r.stdout == b"\xff\x00" and r.stderr == b""
    assert warren.ExecResult.from_json({"exit_code": 0, "stdout": "hi", "stderr": ""}, binary=True).stdout == b"hi"
    assert warren.ExecResult.from_json(d).stdout == "\ufffd\x00"


def test_tar_members_that_leave_the_destination_are_refused(tmp_path: Path) -> None:
    import tarfile

    from warren._files import _check_member

    dest = str(tmp_path.resolve())
    os.symlink("/etc", tmp_path / "out")

    def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
        m = tarfile.TarInfo(name)
        m.type = kind
        m.linkname = link
        return m

    _check_member(member("a/b"), dest)
    _check_member(member("l", tarfile.SYMTYPE, "/anywhere"), dest)  # a link itself is harmless
    for bad in (member("../x"), member("/abs"), member("out/passwd"), member("h", tarfile.LNKTYPE, "../../etc/passwd")):
        with pytest.raises(ValueError):
            _check_member(bad, dest)


def test_distribution_name_is_free_and_module_is_warren() -> None:
    # `warren` on the public package index is an unrelated project.
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert '\nname = "warren-sandbox"\n' in text
    assert 'packages = ["warren"]' in text
    assert warren.__name__ == "warren"


async def test_tokens_are_sent_and_401_names_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_TOKEN", "from-env")
    seen: list = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req.headers.get("authorization"))
        return httpx.Response(401, json={"error": {"code": "unauthorized", "message": "bad token"}})

    for kwargs, want in [({}, "Bearer from-env"), ({"token": "explicit"}, "Bearer explicit")]:
        client = warren.AsyncClient("http://127.0.0.1:7443", **kwargs)  # type: ignore[arg-type]
        http = client._http
        http.targets[0].client = httpx.AsyncClient(
            transport=httpx.MockTransport(handler), base_url=http.base_url, headers=http.headers
        )
        with pytest.raises(warren.Unauthorized) as e:
            await client.get("n1-01jd0m7x4e8k0k9yq1w2e3r4t5")
        assert seen[-1] == want
        assert "http://127.0.0.1:7443" in str(e.value) and "token sent was refused" in str(e.value)
    monkeypatch.delenv("WARREN_TOKEN")
    client = warren.AsyncClient("http://127.0.0.1:7443")
    assert "authorization" not in client._http.headers


def test_ca_files_make_tls_contexts(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import ssl

    monkeypatch.delenv("WARREN_CA", raising=False)
    assert warren.AsyncClient("https://node:7443")._http.verify is True
    missing = tmp_path / "missing.pem"
    with pytest.raises(OSError):
        warren.AsyncClient("https://node:7443", ca=str(missing))
    monkeypatch.setenv("WARREN_CA", str(missing))
    with pytest.raises(OSError):
        warren.AsyncClient("https://node:7443")
    # Plain URLs never read the CA.
    assert warren.AsyncClient("http://127.0.0.1:1")._http.verify is True
    assert isinstance(ssl.create_default_context(), ssl.SSLContext)


def test_revive_report_parses() -> None:
    from warren._models import ReviveReport

    d = {
        "sandbox": {"id": "n1-x", "substrate": "container", "state": "running", "image": ["default"], "limits": {}},
        "revived_from": "n1-y",
        "replayed": 3,
        "steps_replayed": 2,
        "skipped": 1,
        "last_step": 7,
        "divergences": 1,
        "first_divergence": {
            "step": 5,
            "seq": 4,
            "kind": "exec",
            "expected": {"exit_code": 0, "stdout_sha256": "a"},
            "got": {"exit_code": 0, "stdout_sha256": "b"},
        },
        "stopped": False,
        "duration_ms": 12.5,
        "recorded_ms": 11.0,
    }
    r = ReviveReport.from_json(d, SandboxInfo.from_json(d["sandbox"]))
    assert r.sandbox.id == "n1-x" and r.last_step == 7 and r.divergences == 1
    assert r.first_divergence is not None and r.first_divergence.step == 5
    assert r.first_divergence.got["stdout_sha256"] == "b"
    assert ReviveReport.from_json({**d, "first_divergence": None}, None).first_divergence is None


async def test_revive_and_continue_waits_for_the_node_to_be_called_lost() -> None:
    report = {
        "sandbox": INFO,
        "revived_from": "n2-01jd0m7x4e8k0k9yq1w2e3r4t5",
        "replayed": 4,
        "steps_replayed": 4,
        "skipped": 0,
        "last_step": 4,
        "divergences": 0,
        "first_divergence": None,
        "stopped": False,
        "duration_ms": 1.0,
        "recorded_ms": 1.0,
    }
    unreachable = {"error": {"code": "node_unreachable", "message": "node n2 does not answer"}}
    calls: List[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.path)
        if len(calls) <= 2:
            return httpx.Response(503, json=unreachable)
        return httpx.Response(200, json=report)

    c = warren.AsyncClient("unix:///nonexistent.sock")
    _mock(c, handler)
    r = await c.revive_and_continue(report["revived_from"], poll=0.01)
    assert r.sandbox.id == INFO["id"] and r.next_step == 5
    assert calls == [f"/v1/sandboxes/{report['revived_from']}/revive"] * 3
    assert warren.ReviveReport.from_json({**report, "last_step": None}, None).next_step == 1

    # A node that is never called lost: the wait runs out with the node's error.
    calls.clear()
    _mock(c, lambda req: calls.append(req.url.path) or httpx.Response(503, json=unreachable))
    with pytest.raises(warren.NodeUnreachable):
        await c.revive_and_continue("n2-01jd0m7x4e8k0k9yq1w2e3r4t5", wait=0.05, poll=0.01)
    assert 2 <= len(calls)
    # Other errors at once.
    calls.clear()
    nf = {"error": {"code": "not_found", "message": "no such sandbox"}}
    _mock(c, lambda req: calls.append(req.url.path) or httpx.Response(404, json=nf))
    with pytest.raises(warren.NotFound):
        await c.revive_and_continue("n2-01jd0m7x4e8k0k9yq1w2e3r4t5", poll=0.01)
    assert len(calls) == 1
