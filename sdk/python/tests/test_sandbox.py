"""Every public method against the session's own node, async and sync."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest
from conftest import SMALL

import warren

# A spawn that never answers must fail the test, not hang the suite.
SPAWN_DEADLINE = 15.0


async def spawn(sb: warren.AsyncSandbox, cmd: warren.Command, **kw: object) -> warren.AsyncProcess:
    try:
        return await asyncio.wait_for(sb.spawn(cmd, **kw), SPAWN_DEADLINE)  # type: ignore[arg-type]
    except asyncio.TimeoutError:
        pytest.fail(f"POST /v1/sandboxes/{{id}}/processes did not answer within {SPAWN_DEADLINE} s")


# -- client ---------------------------------------------------------------------------------


async def test_health(aclient: warren.AsyncClient, node: object) -> None:
    h = await aclient.health()
    assert h.status == "ok"
    assert h.node == node.name  # type: ignore[attr-defined]
    assert "container" in h.substrates
    assert h.version


async def test_create_with_every_option(aclient: warren.AsyncClient) -> None:
    sb = await aclient.create(
        image=["default"],
        substrate="container",
        cpus=0.5,
        memory="96M",
        disk="64M",
        pids=128,
        ttl=600,
        idle_timeout=300,
        env={"GREETING": "hello"},
        workdir="/tmp",
        user="root",
        network="none",
        labels={"suite": "py", "case": "options"},
        hostname="box1",
    )
    async with sb:
        i = sb.info
        assert i.id.startswith((await aclient.health()).node + "-")
        assert i.state == "running" and i.substrate == "container" and i.image == ["default"]
        assert (i.limits.cpus, i.limits.memory_mb, i.limits.disk_mb, i.limits.pids) == (0.5, 96, 64, 128)
        assert i.labels == {"suite": "py", "case": "options"}
        assert i.env == {"GREETING": "hello"} and i.workdir == "/tmp" and i.user == "root"
        assert i.expires_at_ms is not None and i.idle_timeout_secs == 300
        r = await sb.exec("echo $GREETING; pwd; hostname; id -u")
        assert r.stdout.split() == ["hello", "/tmp", "box1", "0"]
        assert (await sb.refresh()).last_activity_ms >= i.last_activity_ms
    with pytest.raises(warren.NotFound):
        await sb.refresh()


async def test_create_with_a_disk_medium(aclient: warren.AsyncClient) -> None:
    # On disk (the node's default) the writable layer may exceed the memory; in memory it
    # is a tmpfs that cannot.
    on_disk = await aclient.create(memory=SMALL, disk=4 * SMALL, disk_medium="disk")
    async with on_disk:
        assert on_disk.info.limits.disk_medium == "disk"
        assert on_disk.info.limits.disk_mb == 4 * SMALL
        r = await on_disk.exec("stat -f -c %T /")
        assert r.stdout.strip() == "overlayfs"
    in_memory = await aclient.create(memory=SMALL, disk=SMALL // 2, disk_medium="memory")
    async with in_memory:
        assert in_memory.info.limits.disk_medium == "memory"
        r = await in_memory.exec(f"dd if=/dev/zero of=/root/f bs=1M count={SMALL} 2>&1; echo rc=$?")
        assert "No space left" in r.stdout and "rc=0" not in r.stdout
    with pytest.raises(warren.InvalidRequest):
        await aclient.create(memory=SMALL, disk=4 * SMALL, disk_medium="memory")


async def test_idempotent_create(aclient: warren.AsyncClient) -> None:
    key = os.urandom(8).hex()
    a = await aclient.create(memory=SMALL, idempotency_key=key)
    try:
        b = await aclient.create(memory=SMALL, idempotency_key=key)
        assert a.id == b.id and b.info.idempotency_key == key
        with pytest.raises(warren.Conflict) as ei:
            await aclient.create(memory=SMALL + 1, idempotency_key=key)
        assert ei.value.code == "conflict" and ei.value.status == 409
    finally:
        await a.delete()


async def test_get_list_delete_all(aclient: warren.AsyncClient) -> None:
    tag = os.urandom(6).hex()
    boxes = await asyncio.gather(*(aclient.create(memory=SMALL, labels={"tag": tag, "n": str(i)}) for i in range(3)))
    got = await aclient.get(boxes[0].id)
    assert got.id == boxes[0].id and got.info.labels["tag"] == tag
    listed = await aclient.list(labels={"tag": tag})
    assert sorted(s.id for s in listed) == sorted(b.id for b in boxes)
    assert [s.id for s in await aclient.list(labels={"tag": tag, "n": "1"})] == [boxes[1].id]
    assert len(await aclient.list(labels={"tag": tag}, state="running")) == 3
    assert await aclient.list(labels={"tag": tag}, state="stopped") == []
    assert await aclient.delete_all(labels={"tag": tag}) == 3
    assert await aclient.list(labels={"tag": tag}) == []
    await boxes[0].delete()  # already gone: fine
    with pytest.raises(warren.NotFound):
        await boxes[0].delete(missing_ok=False)


# -- exec -----------------------------------------------------------------------------------


async def test_exec(asb: warren.AsyncSandbox) -> None:
    r = await asb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (3, None, "out\n", "err\n")
    assert not r.ok and not r.truncated and not r.timed_out and r.duration > 0
    assert r.output == "out\nerr\n" and asb.client.url.startswith("unix://")
    r = await asb.exec(["printf", "%s|", "a b", "$HOME"])
    assert r.stdout == "a b|$HOME|" and r.ok
    r = await asb.exec("cat; pwd; echo $X", stdin="from stdin\n", cwd="/etc", env={"X": "y"})
    assert r.stdout == "from stdin\n/etc\ny\n"
    r = await asb.exec(["cat"], stdin=b"bytes in")
    assert r.stdout == "bytes in"
    every_byte = bytes(range(256)) * 64
    r = await asb.exec(["cat"], stdin=every_byte, binary=True)
    assert r.stdout == every_byte and r.stderr == b""
    r = await asb.exec("id -un", user="nobody")
    assert r.stdout.strip() == "nobody"


async def test_stats(asb: warren.AsyncSandbox) -> None:
    first = await asb.stats()
    assert first["id"] == asb.id and first["state"] == "running"
    assert first["memory_limit_bytes"] == SMALL << 20 and first["pids_limit"] > 0
    # 8 MiB written to the writable layer shows as disk in use; a busy second shows as CPU.
    await asb.exec("head -c 8388608 /dev/zero > /tmp/f && timeout 1 sh -c 'while :; do :; done'; true")
    s = await asb.stats()
    # The memory cgroup flushes its statistics in per-CPU batches of up to 64 pages.
    pending = 64 * 4096 * (os.cpu_count() or 1)
    assert s["disk_bytes"] + pending >= 8 << 20, s
    assert s["cpu_share"] > 0.05 and s["window_secs"] > 0.5, s
    assert s["pids"] >= 1 and s["memory_bytes"] > 0 and s["trajectory_bytes"] > 0


async def test_exec_timeout_and_truncation(asb: warren.AsyncSandbox) -> None:
    r = await asb.exec("sleep 30", timeout=0.5)
    assert r.timed_out and r.duration < 10
    r = await asb.exec("head -c 5000 /dev/zero | tr '\\0' x; head -c 300 /dev/zero >&2", max_output=1000)
    assert r.stdout_truncated and r.truncated and not r.stderr_truncated
    assert len(r.stdout) == 1000 and r.stdout_bytes == 5000 and r.stderr_bytes == 300
    r = await asb.exec("kill -9 $$")
    assert r.signal == 9 and r.exit_code is None


async def test_exec_check(asb: warren.AsyncSandbox) -> None:
    assert (await asb.exec("true", check=True)).ok
    with pytest.raises(warren.CommandError) as ei:
        await asb.exec("echo boom >&2; exit 7", check=True)
    e = ei.value
    assert e.result.exit_code == 7 and "boom" in str(e) and e.code == "command_failed"
    with pytest.raises(warren.CommandError):
        await asb.exec("sleep 5", timeout=0.2, check=True)


async def test_exec_stream(asb: warren.AsyncSandbox) -> None:
    stream = asb.exec_stream("for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.05; done; exit 4")
    chunks = [c async for c in stream]
    out = "".join(c.data for c in chunks if c.stream == "stdout")
    err = "".join(c.data for c in chunks if c.stream == "stderr")
    assert out == "o1\no2\no3\n" and err == "e1\ne2\ne3\n"
    assert all(isinstance(c, warren.OutputChunk) for c in chunks)
    r = stream.result
    assert r is not None and r.exit_code == 4 and r.stdout == out and r.stderr == err
    r = await asb.exec_stream(["cat"], stdin="piped").wait()
    assert r.stdout == "piped" and r.ok
    with pytest.raises(warren.CommandError):
        await asb.exec_stream("exit 1", check=True).wait()
    # Leaving early closes the stream, which ends the command.
    async with asb.exec_stream("while true; do echo tick; sleep 0.05; done") as s:
        first = await s.__anext__()
        assert first.data.startswith("tick")
    with pytest.raises(warren.InvalidRequest):
        await asb.exec_stream("true", cwd="relative").wait()


# -- processes ------------------------------------------------------------------------------


async def test_spawn_wait_kill(asb: warren.AsyncSandbox) -> None:
    p = await spawn(asb, "echo started; sleep 0.3; echo done; exit 2")
    assert p.pid > 0
    r = await p.wait(timeout=30)
    assert r.exit_code == 2 and r.stdout == "started\ndone\n"
    info = await p.info()
    assert info.state == "exited" and info.exit_code == 2 and not info.running
    long = await spawn(asb, ["sleep", "60"])
    assert (await long.info()).running
    assert long.pid in [pi.pid for pi in await asb.processes()]
    with pytest.raises(warren.Timeout) as ei:
        await long.wait(timeout=0.3)
    assert ei.value.status == 504
    await long.kill(15)
    r = await long.wait(timeout=30)
    assert r.signal == 15
    again = asb.process(long.pid)
    assert (await again.info()).signal == 15
    with pytest.raises(warren.CommandError):
        await (await spawn(asb, "exit 9")).wait(check=True)
    with pytest.raises(warren.NotFound):
        await asb.process(999999).info()


# -- files ----------------------------------------------------------------------------------


async def test_files(asb: warren.AsyncSandbox) -> None:
    f = asb.files
    await f.write("/tmp/a.txt", "hello\n")
    assert await f.read("/tmp/a.txt") == b"hello\n"
    assert await f.read_text("/tmp/a.txt") == "hello\n"
    await f.write("/tmp/bin.dat", bytes(range(256)) * 10, mode=0o600)
    st = await f.stat("/tmp/bin.dat")
    assert (st.kind, st.size, st.mode, st.is_file, st.is_dir) == ("file", 2560, 0o600, True, False)
    assert await f.read("/tmp/bin.dat") == bytes(range(256)) * 10
    await f.mkdir("/tmp/d1/d2/d3", parents=True, mode=0o750)
    assert (await f.stat("/tmp/d1/d2/d3")).mode == 0o750
    await f.mkdir("/tmp/d1/d2/d3", parents=True)  # existing: fine with parents
    await f.mkdir("/tmp/d1/x")
    await f.write("/tmp/d1/file", b"")
    names = sorted(e.name for e in await f.list("/tmp/d1"))
    assert names == ["d2", "file", "x"]
    kinds = {e.name: e.kind for e in await f.list("/tmp/d1")}
    assert kinds == {"d2": "dir", "file": "file", "x": "dir"}
    await f.chmod("/tmp/d1/file", 0o755)
    assert (await f.stat("/tmp/d1/file")).mode == 0o755
    await asb.exec("ln -s /etc/hostname /tmp/link")
    link = await f.stat("/tmp/link")
    assert link.kind == "symlink" and link.link_target == "/etc/hostname"
    assert await f.exists("/tmp/a.txt") and not await f.exists("/tmp/nope")
    await f.remove("/tmp/a.txt")
    assert not await f.exists("/tmp/a.txt")
    with pytest.raises(warren.FileError):
        await f.remove("/tmp/d1")
    await f.remove("/tmp/d1", recursive=True)
    assert not await f.exists("/tmp/d1")
    # Streamed writes from a file object and an async generator, streamed reads.
    with tempfile.TemporaryFile() as tf:
        tf.write(b"x" * 3_000_000)
        tf.seek(0)
        await f.write("/tmp/big", tf)

    async def gen():  # type: ignore[no-untyped-def]
        for i in range(5):
            yield f"part{i};".encode()

    await f.write("/tmp/gen", gen())
    assert await f.read_text("/tmp/gen") == "part0;part1;part2;part3;part4;"
    total = 0
    async for chunk in f.iter_read("/tmp/big", chunk_size=1 << 16):
        assert chunk.count(b"x") == len(chunk)
        total += len(chunk)
    assert total == 3_000_000


async def test_upload_download(asb: warren.AsyncSandbox, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    data = os.urandom(5 * (1 << 20) + 123)
    src.write_bytes(data)
    assert await asb.files.upload(src, "/tmp/up.bin", mode=0o640) == len(data)
    assert (await asb.files.stat("/tmp/up.bin")).mode == 0o640
    r = await asb.exec("sha256sum /tmp/up.bin")
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    dst = tmp_path / "dst.bin"
    assert await asb.files.download("/tmp/up.bin", dst) == len(data)
    assert dst.read_bytes() == data
    with pytest.raises(warren.NotFound):
        await asb.files.download("/tmp/missing", tmp_path / "never")
    assert not (tmp_path / "never").exists()


# -- terminal -------------------------------------------------------------------------------


async def test_upload_and_download_directories(asb: warren.AsyncSandbox, tmp_path: Path) -> None:
    src = tmp_path / "repo"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "pkg" / "run.sh").write_text("echo run\n")
    os.chmod(src / "pkg" / "run.sh", 0o751)
    (src / "pkg" / "deep" / "data.bin").write_bytes(bytes(range(256)) * 4096)
    os.symlink("pkg/run.sh", src / "link")
    os.utime(src / "pkg" / "run.sh", (1_500_000_000, 1_500_000_000))
    await asb.files.upload_dir(src, "/workspace/repo")
    r = await asb.exec("stat -c '%a %Y' /workspace/repo/pkg/run.sh; readlink /workspace/repo/link; /workspace/repo/link")
    assert r.stdout == "751 1500000000\npkg/run.sh\nrun\n", r
    back = tmp_path / "back"
    await asb.files.download_dir("/workspace/repo", back)
    assert (back / "pkg" / "deep" / "data.bin").read_bytes() == bytes(range(256)) * 4096
    st = os.stat(back / "pkg" / "run.sh")
    assert (st.st_mode & 0o7777, int(st.st_mtime)) == (0o751, 1_500_000_000)
    assert os.readlink(back / "link") == "pkg/run.sh"


async def test_extend_lifetime(asb: warren.AsyncSandbox, aclient: warren.AsyncClient) -> None:
    import time

    before = int(time.time() * 1000)
    await asb.extend(3600)
    assert asb.info.expires_at_ms is not None and asb.info.expires_at_ms >= before + 3_600_000
    h = await aclient.health()
    assert "max_ttl_secs" in h.defaults


async def test_pty(asb: warren.AsyncSandbox) -> None:
    async with await asb.pty("/bin/sh", cols=100, rows=30) as t:
        await t.send("stty size; echo mark-$((6*7))\n")
        out = await t.read_until(b"mark-42", timeout=10)
        assert b"30 100" in out
        await t.resize(120, 40)
        await t.send("stty size\n")
        assert b"40 120" in await t.read_until(b"40 120", timeout=10)
        await t.send("exit 3\n")
        assert await t.wait(timeout=10) == 3
        assert t.exited and t.exit_code == 3 and await t.recv() == b""
    async with await asb.pty("echo one line") as t2:
        data = b"".join([c async for c in t2])
        assert b"one line" in data and t2.exit_code == 0
    with pytest.raises(warren.InvalidRequest):
        await asb.pty("   ")


async def test_http_to_a_port_inside(asb: warren.AsyncSandbox) -> None:
    await asb.exec("mkdir -p /srv && echo served > /srv/f.txt", check=True)
    await spawn(asb, "python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv")
    resp = None
    for _ in range(300):
        try:
            resp = await asb.http(8000, "/f.txt")
            break
        except warren.PortUnreachable:
            await asyncio.sleep(0.1)
    assert resp is not None, "the server never listened"
    assert resp.status_code == 200 and resp.text == "served\n"
    assert resp.headers["warren-port"] == "8000"
    # The server's own errors come back as answers; Warren's are exceptions.
    missing = await asb.http(8000, "missing.txt")
    assert missing.status_code == 404
    with pytest.raises(warren.PortUnreachable):
        await asb.http(8001)
    with pytest.raises(ValueError):
        asb.port_path(0)
    assert asb.url(8000, "/a?b=1").endswith(f"/v1/sandboxes/{asb.id}/ports/8000/a?b=1")


# -- lifecycle features the node is gaining ---------------------------------------------------


async def test_pause_resume_fork_snapshot(asb: warren.AsyncSandbox, aclient: warren.AsyncClient) -> None:
    """Each works where the node serves it, else raises Unsupported (never a bare HTTP error)."""
    try:
        await asb.pause()
    except warren.Unsupported as e:
        assert "pause" in str(e)
    else:
        assert (await asb.refresh()).state == "paused"
        await asb.resume()
        assert (await asb.refresh()).state == "running"
    try:
        forks = await asb.fork(2)
    except warren.Unsupported as e:
        assert "fork" in str(e)
    else:
        assert len(forks) == 2
        for child in forks:
            await child.delete()
    try:
        snap = await asb.snapshot()
    except warren.Unsupported as e:
        assert "snapshot" in str(e)
    else:
        assert isinstance(snap, dict)
    assert (await asb.exec("true")).ok


async def test_context_managers_delete(aclient: warren.AsyncClient) -> None:
    async with await aclient.create(memory=SMALL) as sb:
        sid = sb.id
    with pytest.raises(warren.NotFound):
        await aclient.get(sid)
    with pytest.raises(RuntimeError):
        async with await aclient.create(memory=SMALL) as sb2:
            sid = sb2.id
            raise RuntimeError("boom")
    with pytest.raises(warren.NotFound):
        await aclient.get(sid)


async def test_pool_bounds_concurrent_calls(url: str) -> None:
    """max_connections caps calls in flight; the rest wait their turn (no error)."""
    async with warren.AsyncClient(url, max_connections=2) as c:
        async with await c.create(memory=SMALL) as sb:
            t0 = asyncio.get_running_loop().time()
            results = await asyncio.gather(*(sb.exec("sleep 0.3") for _ in range(6)))
            took = asyncio.get_running_loop().time() - t0
            assert all(r.ok for r in results)
            assert took >= 0.85, f"6 calls of 0.3 s through 2 connections took only {took:.2f} s"
            assert len(c._http.client._transport._idle) <= 2  # type: ignore[attr-defined]
