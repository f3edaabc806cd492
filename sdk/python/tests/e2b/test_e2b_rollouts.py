"""Whole rollouts through E2B's SDK: a sandbox driven only through E2B exports a trajectory
like a native one, and ``AsyncSandbox`` with 100 sandboxes at once (create, commands, files,
kill) ends without an error."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any, Dict, List

import warren


def test_a_sandbox_driven_through_e2b_exports_its_trajectory(opts: Dict[str, Any], e2b_node: Any) -> None:
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120, **opts)
    try:
        assert sb.commands.run("echo one").stdout == "one\n"
        sb.files.write("/tmp/t.txt", "two")
        assert sb.files.read("/tmp/t.txt") == "two"
        with warren.Client(e2b_node.node.url) as c:
            native = c.create(memory=64)
            try:
                native.exec(["sh", "-c", "echo one"])
                native_kinds = {e["call"]["kind"] if isinstance(e.get("call"), dict) else e.get("kind") for e in native.trajectory()}
            finally:
                native.delete()
            entries = c.get(sb.sandbox_id).trajectory()
        kinds = {e["call"]["kind"] if isinstance(e.get("call"), dict) else e.get("kind") for e in entries}
        # The same kinds of entries as a native sandbox's, and the E2B command among them.
        assert native_kinds <= kinds, (native_kinds, kinds)
        assert any("echo one" in str(e) for e in entries), entries
        seqs = [e["seq"] for e in entries]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    finally:
        sb.kill()


def test_100_async_sandboxes_at_once(opts: Dict[str, Any]) -> None:
    from e2b import AsyncSandbox, Sandbox, SandboxQuery

    run = secrets.token_hex(4)

    async def rollout(i: int) -> str:
        sb = await AsyncSandbox.create(timeout=120, metadata={"run": run}, **opts)
        try:
            r = await sb.commands.run(f"echo {i}")
            assert r.stdout == f"{i}\n" and r.exit_code == 0
            await sb.files.write(f"/tmp/{i}", str(i))
            assert await sb.files.read(f"/tmp/{i}") == str(i)
        finally:
            await sb.kill()
        return sb.sandbox_id

    async def main() -> List[Any]:
        return await asyncio.gather(*(rollout(i) for i in range(100)), return_exceptions=True)

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert len(set(results)) == 100
    assert Sandbox.list(query=SandboxQuery(metadata={"run": run}), **opts).next_items() == []
