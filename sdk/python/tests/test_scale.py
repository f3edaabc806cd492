"""Scale and durability: many sandboxes from one AsyncClient, reconnecting from another
process, and a 1 GiB file streamed both ways with flat memory."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import SMALL

import warren

CONCURRENT = int(os.environ.get("WARREN_TEST_CONCURRENT", "500"))


def vm_hwm_kib() -> int:
    """Peak resident set size of this process (VmHWM), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


@pytest.mark.slow
async def test_concurrent_sandboxes(url: str) -> None:
    """CONCURRENT sandboxes at once from one client: create, exec `true`, delete. The node
    starts at most `--max-starting` (64) at once and refuses the rest with `busy`; creates that
    carry an idempotency key are safe to repeat, so the client waits those refusals out and
    every create gets through."""
    async with warren.AsyncClient(url, max_retries=100) as aclient:
        await _concurrent(aclient)


async def _concurrent(aclient: warren.AsyncClient) -> None:
    tag = os.urandom(6).hex()

    async def one(i: int) -> float:
        t0 = time.monotonic()
        sb = await aclient.create(memory=SMALL, labels={"scale": tag}, idempotency_key=f"{tag}-{i}")
        try:
            r = await sb.exec(["true"])
            assert r.exit_code == 0, r
            r = await sb.exec(f"echo {i}")
            assert r.stdout == f"{i}\n"
        finally:
            await sb.delete()
        return time.monotonic() - t0

    t0 = time.monotonic()
    results = await asyncio.gather(*(one(i) for i in range(CONCURRENT)), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    took = time.monotonic() - t0
    print(f"\n{CONCURRENT} sandboxes created, used and deleted concurrently in {took:.1f} s")
    assert not errors, f"{len(errors)} of {CONCURRENT} failed; first: {errors[0]!r}"
    assert await aclient.list(labels={"scale": tag}) == []


def test_reconnect_from_another_process(client: warren.Client, url: str) -> None:
    """A sandbox made by a process that exited is found by label and used."""
    tag = os.urandom(6).hex()
    script = textwrap.dedent(
        f"""
        import warren
        c = warren.Client({url!r})
        sb = c.create(memory={SMALL}, labels={{"owner": "trainer", "run": {tag!r}}})
        sb.files.write("/tmp/state.txt", "step 41")
        print(sb.id)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    made = out.stdout.strip()
    found = client.list(labels={"run": tag})
    assert [s.id for s in found] == [made]
    sb = found[0]
    try:
        assert sb.info.labels == {"owner": "trainer", "run": tag}
        assert sb.files.read_text("/tmp/state.txt") == "step 41"
        assert sb.exec("cat /tmp/state.txt; echo ' -> 42'").stdout == "step 41 -> 42\n"
        assert client.get(made).id == made
    finally:
        sb.delete()


@pytest.mark.slow
async def test_one_gib_round_trip(aclient: warren.AsyncClient, tmp_path: Path) -> None:
    """1 GiB uploaded and downloaded in streams: checksums equal, RSS grows < 200 MB."""
    size = 1 << 30
    src = tmp_path / "big.bin"
    want = hashlib.sha256()
    block = os.urandom(1 << 20)
    with open(src, "wb") as f:
        for i in range(size // len(block)):
            chunk = i.to_bytes(8, "little") + block[8:]
            want.update(chunk)
            f.write(chunk)
    base = vm_hwm_kib()
    # The writable layer lives in memory: give the sandbox room for the file.
    async with await aclient.create(memory="1600M", disk="1200M") as sb:
        t0 = time.monotonic()
        assert await sb.files.upload(src, "/tmp/big.bin") == size
        up = time.monotonic() - t0
        r = await sb.exec("sha256sum /tmp/big.bin", timeout=120)
        assert r.stdout.split()[0] == want.hexdigest()
        dst = tmp_path / "back.bin"
        t0 = time.monotonic()
        assert await sb.files.download("/tmp/big.bin", dst) == size
        down = time.monotonic() - t0
    src.unlink()
    got = hashlib.sha256()
    with open(dst, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            got.update(b)
    assert got.hexdigest() == want.hexdigest()
    grew_mb = (vm_hwm_kib() - base) / 1024
    print(
        f"\n1 GiB: upload {size / up / 1e6:.0f} MB/s, download {size / down / 1e6:.0f} MB/s, "
        f"peak RSS growth {grew_mb:.0f} MB"
    )
    assert grew_mb < 200, f"RSS grew {grew_mb:.0f} MB while streaming 1 GiB"
