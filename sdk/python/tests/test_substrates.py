"""The same checks for every substrate: only ``substrate=`` changes.

Runs for each substrate in ``$WARREN_TEST_SUBSTRATES`` (default ``container,microvm``); a
substrate the node does not serve (no QEMU or guest kernel on the host) is skipped with the
node's reason. One sandbox per substrate serves the whole module: VMs under software emulation
are slow to make.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from typing import AsyncIterator

import pytest
import pytest_asyncio

import warren

SUBSTRATES = [s.strip() for s in os.environ.get("WARREN_TEST_SUBSTRATES", "container,microvm").split(",") if s.strip()]
# Guest RAM of a VM (a guest kernel needs more than a container's processes).
MEMORY = {"container": 64, "microvm": 256, "vm": 384}
# Creating a VM may boot its template first (seconds, more under software emulation).
CREATE_DEADLINE = 300.0


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=SUBSTRATES)
async def box(request: pytest.FixtureRequest, url: str) -> AsyncIterator[warren.AsyncSandbox]:
    substrate = request.param
    async with warren.AsyncClient(url) as c:
        served = (await c.health()).substrates
        if substrate not in served:
            pytest.skip(f"the node does not serve {substrate} (serves {served}; see its log for why)")
        sb = await asyncio.wait_for(
            c.create(substrate=substrate, memory=MEMORY.get(substrate, 256), labels={"suite": "substrates"}),
            CREATE_DEADLINE,
        )
        try:
            yield sb
        finally:
            await sb.delete()


# Module-scoped async fixtures need a module-scoped event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_exec_env_cwd_and_exit(box: warren.AsyncSandbox) -> None:
    assert box.info.state == "running"
    r = await box.exec("cat; pwd; echo $X; echo err >&2; exit 3", stdin="in\n", cwd="/etc", env={"X": "y"})
    assert (r.exit_code, r.stdout, r.stderr) == (3, "in\n/etc\ny\n", "err\n")
    r = await box.exec("id -un", user="nobody")
    assert r.stdout.strip() == "nobody"


async def test_timeout_and_output_cap(box: warren.AsyncSandbox) -> None:
    r = await box.exec("sleep 30", timeout=0.5)
    assert r.timed_out and r.duration < 20
    r = await box.exec("head -c 5000 /dev/zero | tr '\\0' x", max_output=1000)
    assert r.stdout_truncated and len(r.stdout) == 1000 and r.stdout_bytes == 5000


async def test_files_round_trip(box: warren.AsyncSandbox) -> None:
    data = os.urandom(3 * (1 << 20) + 7)
    await box.files.write("/root/blob", data, mode=0o640)
    st = await box.files.stat("/root/blob")
    assert (st.size, st.mode) == (len(data), 0o640)
    r = await box.exec("sha256sum /root/blob")
    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert await box.files.read("/root/blob") == data
    await box.files.mkdir("/root/d/e", parents=True)
    assert sorted(e.name for e in await box.files.list("/root/d")) == ["e"]
    await box.files.remove("/root/d", recursive=True)
    assert not await box.files.exists("/root/d")


async def test_background_process_and_stream(box: warren.AsyncSandbox) -> None:
    p = await box.spawn("echo started; sleep 60")
    assert p.pid in [pi.pid for pi in await box.processes()]
    await p.kill(15)
    assert (await p.wait(timeout=30)).signal == 15
    stream = box.exec_stream("for i in 1 2 3; do echo o$i; done")
    out = "".join([c.data async for c in stream])
    assert out == "o1\no2\no3\n"


async def test_terminal(box: warren.AsyncSandbox) -> None:
    async with await box.pty("/bin/sh", cols=100, rows=30) as t:
        await t.send("stty size; echo mark-$((6*7))\n")
        out = await t.read_until(b"mark-42", timeout=20)
        assert b"30 100" in out
        await t.send("exit 3\n")
        assert await t.wait(timeout=20) == 3
