"""The blocking API: every method, and the same answers as the async API."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any, Dict

import pytest
from conftest import SMALL

import warren


def strip(r: warren.ExecResult) -> Dict[str, Any]:
    d = dataclasses.asdict(r)
    d.pop("duration")
    return d


SCRIPT = "echo out; echo err >&2; head -c 3000 /dev/zero | tr '\\0' y; exit 5"


async def test_sync_and_async_agree(client: warren.Client, aclient: warren.AsyncClient) -> None:
    tag = os.urandom(6).hex()
    with client.create(memory=SMALL, labels={"agree": tag}, env={"A": "1"}) as s:
        a = await aclient.get(s.id)
        assert dataclasses.replace(a.info, last_activity_ms=0) == dataclasses.replace(s.info, last_activity_ms=0)
        for cmd, kw in [(SCRIPT, {}), (SCRIPT, {"max_output": 100}), (["sh", "-c", "cat; echo $A"], {"stdin": "x"})]:
            assert strip(s.exec(cmd, **kw)) == strip(await a.exec(cmd, **kw))
        chunks_s = [c for c in s.exec_stream("echo 1; echo 2 >&2")]
        chunks_a = [c async for c in a.exec_stream("echo 1; echo 2 >&2")]
        assert sorted(map(dataclasses.astuple, chunks_s)) == sorted(map(dataclasses.astuple, chunks_a))
        s.files.write("/tmp/f", "same")
        assert s.files.stat("/tmp/f") == await a.files.stat("/tmp/f")
        assert s.files.list("/tmp") == await a.files.list("/tmp")
        assert s.files.read("/tmp/f") == await a.files.read("/tmp/f")
        assert [x.id for x in client.list(labels={"agree": tag})] == [
            x.id for x in await aclient.list(labels={"agree": tag})
        ]
        assert client.health().node == (await aclient.health()).node
        for sync_call, async_call in [
            (lambda: client.get("bad"), aclient.get("bad")),
            (lambda: s.files.read("/nope"), a.files.read("/nope")),
            (lambda: s.files.read("rel"), a.files.read("rel")),
        ]:
            with pytest.raises(warren.WarrenError) as es:
                sync_call()
            with pytest.raises(warren.WarrenError) as ea:
                await async_call
            assert type(es.value) is type(ea.value) and es.value.code == ea.value.code


def test_sync_every_method(client: warren.Client, tmp_path: Path) -> None:
    with client.create(memory=SMALL, labels={"suite": "py"}) as sb:
        assert isinstance(sb, warren.Sandbox) and sb.info.state == "running"
        assert sb.refresh().id == sb.id
        assert client.get(sb.id).id == sb.id
        assert sb.stats()["id"] == sb.id
        assert sb.id in [x.id for x in client.list(labels={"suite": "py"})]
        r = sb.exec("echo hi")
        assert r.stdout == "hi\n" and isinstance(r, warren.ExecResult)
        with pytest.raises(warren.CommandError):
            sb.exec("false", check=True)
        stream = sb.exec_stream("echo a; echo b")
        assert "".join(c.data for c in stream) == "a\nb\n" and stream.result is not None and stream.result.ok
        assert sb.exec_stream("echo w").wait().stdout == "w\n"
        with sb.exec_stream("sleep 30") as st:
            pass
        assert st.result is None
        p = sb.spawn("echo bg; sleep 0.2")
        assert isinstance(p, warren.Process) and p.pid > 0
        assert p.wait(timeout=30).stdout == "bg\n"
        assert p.info().state == "exited"
        p2 = sb.spawn("sleep 60")
        with pytest.raises(warren.Timeout):
            p2.wait(timeout=0.2)
        sb.process(p2.pid).kill(9)
        assert p2.wait(30).signal == 9
        assert {p.pid, p2.pid} <= {x.pid for x in sb.processes()}
        f = sb.files
        f.mkdir("/tmp/s/t", parents=True, mode=0o700)
        f.write("/tmp/s/t/x", b"123", mode=0o644)
        f.chmod("/tmp/s/t/x", 0o600)
        assert f.stat("/tmp/s/t/x").mode == 0o600 and f.read_text("/tmp/s/t/x") == "123"
        assert [e.name for e in f.list("/tmp/s/t")] == ["x"] and f.exists("/tmp/s/t/x")
        assert b"".join(f.iter_read("/tmp/s/t/x")) == b"123"
        local = tmp_path / "l"
        local.write_bytes(b"z" * 100_000)
        assert f.upload(local, "/tmp/s/up") == 100_000
        assert f.download("/tmp/s/up", tmp_path / "back") == 100_000
        assert (tmp_path / "back").read_bytes() == local.read_bytes()
        f.remove("/tmp/s", recursive=True)
        assert not f.exists("/tmp/s")
        with sb.pty("/bin/sh", cols=90, rows=20) as t:
            assert isinstance(t, warren.Pty)
            t.send("stty size\n")
            assert b"20 90" in t.read_until("20 90", timeout=10)
            t.resize(91, 21)
            t.send("exit 4\n")
            assert t.wait(10) == 4 and t.exit_code == 4 and t.exited and t.signal is None
        for feature, call in [("pause", sb.pause), ("resume", sb.resume), ("snapshot", sb.snapshot), ("fork", sb.fork)]:
            try:
                call()
            except warren.Unsupported as e:
                assert feature in str(e)
        sid = sb.id
    with pytest.raises(warren.NotFound):
        client.get(sid)
    tag = os.urandom(4).hex()
    for _ in range(2):
        client.create(memory=SMALL, labels={"del": tag})
    assert client.delete_all(labels={"del": tag}) == 2


def test_sync_client_from_many_threads(client: warren.Client) -> None:
    with client.create(memory=SMALL) as sb:
        errors = []
        outs = []

        def work(i: int) -> None:
            try:
                outs.append(sb.exec(["echo", str(i)]).stdout.strip())
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and sorted(outs, key=int) == [str(i) for i in range(32)]


def test_sandbox_is_not_built_by_hand() -> None:
    with pytest.raises(TypeError):
        warren.Sandbox()


def test_fork_needs_a_new_client(client: warren.Client) -> None:
    """A Client from before fork() fails clearly in the child; a new one works there."""
    with client.create(memory=SMALL) as sb:
        pid = os.fork()
        if pid == 0:  # child: exit status tells the parent what happened
            code = 1
            try:
                try:
                    sb.exec("true")
                except RuntimeError as e:
                    if "fork" in str(e):
                        code = 2
                if code == 2:
                    with warren.Client(client.url) as c2:
                        code = 0 if c2.get(sb.id).exec("echo ok").stdout == "ok\n" else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert sb.exec("true").ok  # the parent's client is unaffected
