"""Each error code the node can be made to answer arrives as its exception class."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from pathlib import Path

import pytest
from conftest import SMALL, agent_pids, node_name, start_node, stop_node

import warren


async def test_invalid_request(aclient: warren.AsyncClient, asb: warren.AsyncSandbox) -> None:
    with pytest.raises(warren.InvalidRequest) as ei:
        await aclient.create(memory=1)
    assert ei.value.code == "invalid_request" and ei.value.status == 400 and "memory_mb" in ei.value.message
    with pytest.raises(warren.InvalidRequest):
        await aclient.create(cpus=-1)
    with pytest.raises(warren.InvalidRequest):
        await aclient.create(substrate="lambda")
    with pytest.raises(warren.InvalidRequest):
        await aclient.get("not-an-id")
    with pytest.raises(warren.InvalidRequest):
        await aclient.list(state="bogus")
    with pytest.raises(warren.InvalidRequest):
        await asb.exec("true", user="no-such-user")
    with pytest.raises(warren.InvalidRequest):
        await asb.exec("true", timeout=-1)


async def test_invalid_path(asb: warren.AsyncSandbox) -> None:
    for call in (
        asb.files.read("relative/path"),
        asb.files.stat("../etc"),
        asb.files.write("no-slash", b"x"),
        asb.files.list(""),
    ):
        with pytest.raises(warren.InvalidPath) as ei:
            await call
        assert ei.value.code == "invalid_path" and ei.value.status == 400
        assert isinstance(ei.value, warren.InvalidRequest)


async def test_not_found(aclient: warren.AsyncClient, asb: warren.AsyncSandbox) -> None:
    node = (await aclient.health()).node
    missing = f"{node}-01jd0m7x4e8k0k9yq1w2e3r4t5"
    with pytest.raises(warren.NotFound) as ei:
        await aclient.get(missing)
    assert ei.value.status == 404 and ei.value.code == "not_found"
    with pytest.raises(warren.NotFound):
        await aclient.create(image="no-such-image")
    with pytest.raises(warren.NotFound):
        await asb.files.read("/no/such/file")
    with pytest.raises(warren.NotFound):
        await asb.process(424242).wait(timeout=1)


async def test_file_error(asb: warren.AsyncSandbox) -> None:
    with pytest.raises(warren.FileError) as ei:
        await asb.files.list("/etc/passwd")
    assert ei.value.code == "file_error" and ei.value.status == 422
    with pytest.raises(warren.FileError):
        await asb.files.read("/etc")


async def test_unsupported_substrate(aclient: warren.AsyncClient) -> None:
    served = (await aclient.health()).substrates
    for sub in ("function", "microvm", "vm"):
        if sub in served:
            continue
        with pytest.raises(warren.UnsupportedSubstrate) as ei:
            await aclient.create(substrate=sub, memory=SMALL)
        assert ei.value.code == "unsupported_substrate" and ei.value.status == 501
        assert isinstance(ei.value, warren.Unsupported)


async def test_conflict(aclient: warren.AsyncClient) -> None:
    key = os.urandom(8).hex()
    async with await aclient.create(memory=SMALL, idempotency_key=key):
        with pytest.raises(warren.Conflict) as ei:
            await aclient.create(memory=SMALL * 2, idempotency_key=key)
        assert ei.value.status == 409


async def test_timeout(asb: warren.AsyncSandbox) -> None:
    p = await asyncio.wait_for(asb.spawn("sleep 30"), 15)
    with pytest.raises(warren.Timeout) as ei:
        await p.wait(timeout=0.2)
    assert ei.value.code == "timeout" and ei.value.status == 504
    assert isinstance(ei.value, TimeoutError)
    await p.kill()


async def test_sandbox_lost(aclient: warren.AsyncClient) -> None:
    sb = await aclient.create(memory=SMALL)
    try:
        pids = agent_pids(sb.id)
        assert pids, "no process found in the sandbox's cgroup"
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        err: Exception = AssertionError("the node never noticed the lost sandbox")
        for _ in range(100):
            try:
                await sb.exec("true")
            except warren.SandboxLost as e:
                err = e
                break
            except warren.WarrenError as e:  # e.g. the agent connection breaking mid-call
                err = e
            await asyncio.sleep(0.1)
        assert isinstance(err, warren.SandboxLost), repr(err)
        assert err.status == 502
        info = await sb.refresh()
        assert info.state == "failed" and info.reason
        assert [s.id for s in await aclient.list(state="failed")].count(sb.id) == 1
    finally:
        await sb.delete()


def test_limit_exceeded() -> None:
    """A node holding its maximum refuses with limit_exceeded and a retry_after."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start warrend")
    node = start_node(Path(tempfile.mkdtemp(prefix="warren-py-lim-")), node_name("lim"), "--max-sandboxes", "1")
    try:
        with warren.Client(node.url) as c:
            with c.create(memory=SMALL):
                with pytest.raises(warren.LimitExceeded) as ei:
                    c.create(memory=SMALL)
                assert ei.value.code == "limit_exceeded" and ei.value.status == 429
                assert ei.value.retry_after is not None
    finally:
        stop_node(node)
