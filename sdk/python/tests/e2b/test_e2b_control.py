"""E2B's control plane, driven by E2B's own SDK against a private ``warrend --e2b``: create,
get, list with metadata, connect, set_timeout, pause and resume, kill, snapshots, templates,
and the errors the SDK maps (NotFound, 400). Files and processes that must survive a pause
are checked through Warren's own SDK on the same sandbox: an E2B sandbox is a Warren
sandbox under the same id."""

from __future__ import annotations

import datetime
import secrets
from typing import Any, Dict

import pytest

import warren


def test_create_get_and_kill(opts: Dict[str, Any], e2b_node: Any) -> None:
    from e2b import Sandbox

    run = secrets.token_hex(4)
    sb = Sandbox.create(timeout=120, metadata={"run": run}, envs={"GREETING": "hi"}, **opts)
    try:
        assert sb.sandbox_id.startswith(e2b_node.node.name + "-")
        info = sb.get_info()
        assert info.sandbox_id == sb.sandbox_id
        assert info.template_id == "base"
        assert info.metadata == {"run": run}
        assert info.state == "running"
        assert info.memory_mb > 0 and info.cpu_count >= 1
        left = info.end_at - datetime.datetime.now(datetime.timezone.utc)
        assert datetime.timedelta(seconds=60) < left <= datetime.timedelta(seconds=121)
        # It is a Warren sandbox: its env is the sandbox's default for every command.
        with warren.Client(e2b_node.node.url) as c:
            w = c.get(sb.sandbox_id)
            assert w.info.labels == {"run": run}
            assert w.exec(["sh", "-c", "echo $GREETING"]).stdout.strip() == "hi"
    finally:
        assert sb.kill() is True
    assert Sandbox.kill(sb.sandbox_id, **opts) is False


def test_list_by_metadata_and_state_in_pages(opts: Dict[str, Any]) -> None:
    from e2b import Sandbox, SandboxQuery, SandboxState

    run = secrets.token_hex(4)
    made = [Sandbox.create(timeout=120, metadata={"run": run, "i": str(i)}, **opts) for i in range(3)]
    try:
        made[2].pause()
        p = Sandbox.list(query=SandboxQuery(metadata={"run": run}), limit=2, **opts)
        first = p.next_items()
        assert len(first) == 2 and p.has_next
        rest = p.next_items()
        assert not p.has_next
        got = {s.sandbox_id for s in first + rest}
        assert got == {s.sandbox_id for s in made}
        one = Sandbox.list(query=SandboxQuery(metadata={"run": run, "i": "1"}), **opts).next_items()
        assert [s.sandbox_id for s in one] == [made[1].sandbox_id]
        paused = Sandbox.list(query=SandboxQuery(metadata={"run": run}, state=[SandboxState.PAUSED]), **opts)
        assert [s.sandbox_id for s in paused.next_items()] == [made[2].sandbox_id]
        desc = Sandbox.list(query=SandboxQuery(metadata={"run": run}), order="desc", **opts).next_items()
        assert [s.sandbox_id for s in desc] == [s.sandbox_id for s in reversed(made)]
        assert Sandbox.list(query=SandboxQuery(metadata={"run": "nobody"}), **opts).next_items() == []
    finally:
        for s in made:
            s.kill()


def test_set_timeout_moves_the_end(e2b_sandbox: Any) -> None:
    e2b_sandbox.set_timeout(900)
    left = e2b_sandbox.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(seconds=800) < left <= datetime.timedelta(seconds=901)
    e2b_sandbox.set_timeout(30)
    left = e2b_sandbox.get_info().end_at - datetime.datetime.now(datetime.timezone.utc)
    assert left <= datetime.timedelta(seconds=31)


def test_pause_and_connect_keep_files_and_processes(e2b_sandbox: Any, opts: Dict[str, Any], e2b_node: Any) -> None:
    from e2b import Sandbox

    with warren.Client(e2b_node.node.url) as c:
        w = c.get(e2b_sandbox.sandbox_id)
        w.files.write("/tmp/kept", b"still here")
        proc = w.spawn(["sleep", "600"])
        assert e2b_sandbox.pause() is True
        assert e2b_sandbox.get_info().state == "paused"
        assert Sandbox.get_info(e2b_sandbox.sandbox_id, **opts).state == "paused"
        # Pausing a paused sandbox: the SDK's False (409).
        assert e2b_sandbox.pause() is False
        again = Sandbox.connect(e2b_sandbox.sandbox_id, **opts)
        assert again.sandbox_id == e2b_sandbox.sandbox_id
        assert again.get_info().state == "running"
        assert w.files.read("/tmp/kept") == b"still here"
        assert proc.pid in [p.pid for p in w.processes() if p.state == "running"]
        # Connecting to a running sandbox answers it as it is.
        assert Sandbox.connect(e2b_sandbox.sandbox_id, **opts).sandbox_id == e2b_sandbox.sandbox_id


def test_unknown_sandbox_and_template_are_not_found(opts: Dict[str, Any], e2b_node: Any) -> None:
    from e2b import NotFoundException, Sandbox, SandboxException

    ghost = f"{e2b_node.node.name}-01jzzzzzzzzzzzzzzzzzzzzzzz"
    with pytest.raises(NotFoundException):
        Sandbox.connect(ghost, **opts)
    with pytest.raises(NotFoundException):
        Sandbox.get_info(ghost, **opts)
    with pytest.raises(NotFoundException):
        Sandbox.set_timeout(ghost, 60, **opts)
    with pytest.raises(SandboxException) as e:
        Sandbox.create("no-such-template:1", **opts)
    assert "404" in str(e.value) and "template" in str(e.value)


def test_bad_input_is_400(opts: Dict[str, Any]) -> None:
    from e2b import Sandbox, SandboxException

    with pytest.raises(SandboxException) as e:
        Sandbox.create(metadata={"no spaces in keys": "x"}, **opts)
    assert "400" in str(e.value)
    with pytest.raises(SandboxException) as e:
        Sandbox.create(timeout=-5, **opts)
    assert "400" in str(e.value)


def test_templates_and_snapshots(e2b_sandbox: Any, opts: Dict[str, Any]) -> None:
    from e2b import Sandbox

    snap = e2b_sandbox.create_snapshot()
    try:
        listed = [s.snapshot_id for s in e2b_sandbox.list_snapshots().next_items()]
        assert listed == [snap.snapshot_id]
        child = Sandbox.create(snap.snapshot_id, timeout=60, **opts)
        child.kill()
    finally:
        assert Sandbox.delete_snapshot(snap.snapshot_id, **opts) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id, **opts) is False
