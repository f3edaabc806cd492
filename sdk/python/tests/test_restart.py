"""A node's daemon killed with SIGKILL while a step runs: the SDK waits out the restart, its
retry of the step answers the one run (``replayed``), and the command ran once."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict

import pytest

import warren

from conftest import SMALL, _why_not, node_name, start_node, stop_node


def test_a_step_in_flight_across_a_daemon_kill_runs_once_and_answers() -> None:
    why = _why_not()
    if why:
        pytest.skip(why)
    tmp = Path(tempfile.mkdtemp(prefix="warren-py-restart-"))
    name = node_name("pyr")
    node = start_node(tmp, name)
    try:
        with warren.Client(node.url, restart_wait=60) as c:
            sb = c.create(memory=SMALL)
            got: Dict[str, Any] = {}

            def step() -> None:
                try:
                    got["result"] = sb.exec("echo run >> /root/runs; sleep 2; echo finished", step=1)
                except Exception as e:  # reported below
                    got["error"] = e

            t = threading.Thread(target=step)
            t.start()
            deadline = time.monotonic() + 20
            while not sb.files.exists("/root/runs"):
                assert time.monotonic() < deadline, "the step never started"
                time.sleep(0.02)
            node.proc.kill()
            node.proc.wait()
            node = start_node(tmp, name)  # the same socket and state: it re-adopts the sandbox
            t.join(60)
            assert not t.is_alive(), "the step's call never ended"
            assert "error" not in got, got
            r = got["result"]
            assert r.replayed and r.stdout == "finished\n" and r.exit_code == 0, r
            assert sb.exec("cat /root/runs").stdout == "run\n", "the step ran twice"
            # A further retry answers the same, and the trajectory holds the step once.
            again = sb.exec("echo run >> /root/runs; sleep 2; echo finished", step=1)
            assert again.replayed and again.stdout == "finished\n"
            steps = [e for e in sb.trajectory() if e.get("step") == 1]
            assert len(steps) == 1, steps
            sb.delete()
    finally:
        if node.proc.poll() is None:
            stop_node(node)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
