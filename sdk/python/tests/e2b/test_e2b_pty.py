"""E2B's SDK opens a terminal in a Warren sandbox: envd's process service with a PTY, over the
node's attached terminal (`POST /v1/sandboxes/{id}/pty/attach`)."""

from __future__ import annotations

import pytest

pytest.importorskip("e2b")

from e2b.sandbox.commands.command_handle import PtySize  # noqa: E402


def test_pty_runs_typed_commands_resizes_and_exits(e2b_sandbox):
    h = e2b_sandbox.pty.create(PtySize(rows=24, cols=80), envs={"WHO": "warren"}, cwd="/tmp")
    e2b_sandbox.pty.resize(h.pid, PtySize(rows=40, cols=120))
    e2b_sandbox.pty.send_stdin(h.pid, b"echo hi-$((40+2))-$WHO; pwd; stty size\n")
    e2b_sandbox.pty.send_stdin(h.pid, b"exit 7\n")
    screen = bytearray()
    with pytest.raises(Exception) as e:
        h.wait(on_pty=screen.extend)
    assert getattr(e.value, "exit_code", None) == 7
    text = screen.decode(errors="replace")
    assert "hi-42-warren" in text
    assert "/tmp" in text
    assert "40 120" in text


def test_pty_kill(e2b_sandbox):
    h = e2b_sandbox.pty.create(PtySize(rows=24, cols=80))
    assert h.pid in [p.pid for p in e2b_sandbox.commands.list()]
    assert e2b_sandbox.pty.kill(h.pid) is True
    with pytest.raises(Exception):
        h.wait()
    assert e2b_sandbox.pty.kill(h.pid) is False
