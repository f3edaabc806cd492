"""examples/rl/grpo_rollout.py at small N: N tasks × K samples forked from prepared sandboxes,
a preempted driver resumed with no step run twice, per-rollout infrastructure verdicts
(one sample's sandbox killed: revived; one deleted with its log: infra-failed, masked), and
the group's trajectories as JSONL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Node, agent_pids

import warren

SCRIPT = REPO / "examples" / "rl" / "grpo_rollout.py"
TASKS, SAMPLES = 2, 3


def drive(node: Node, workdir: Path, run: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--url",
            node.url,
            "--workdir",
            str(workdir),
            "--run",
            run,
            "--tasks",
            str(TASKS),
            "--samples",
            str(SAMPLES),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_group_rollout_survives_preemption_and_dead_sandboxes(node: Node, tmp_path: Path) -> None:
    run = "rl" + os.urandom(3).hex()
    # Preempted after its 4th sample step ran on the node, before the driver recorded it.
    first = drive(node, tmp_path, run, "--crash-after-steps", "4")
    assert first.returncode == 137, first.stderr
    state = json.loads((tmp_path / "state.json").read_text())
    pending = sorted(k for k, r in state["rollouts"].items() if r["next"] == 0)
    assert len(pending) >= 2, state["rollouts"]
    killed, deleted = pending[-2], pending[-1]
    # One pending sample's sandbox loses its agent; another is deleted, log and all.
    for pid in agent_pids(state["rollouts"][killed]["sandbox"]):
        os.kill(pid, signal.SIGKILL)
    with warren.Client(node.url) as c:
        c.get(state["rollouts"][deleted]["sandbox"]).delete()

    second = drive(node, tmp_path, run)
    assert second.returncode == 0, second.stderr
    lines = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert len(lines) == TASKS * SAMPLES
    by_key = {f"{r['task']}/{r['sample']}": r for r in lines}
    assert by_key[killed]["verdict"] == "revived" and by_key[killed]["revived_from"]
    assert by_key[deleted]["verdict"] == "infra-failed"
    assert by_key[deleted]["mask"] and by_key[deleted]["reward"] is None
    for key, r in by_key.items():
        if r["verdict"] == "infra-failed":
            continue
        steps = [s["step"] for s in r["steps"]]
        assert steps == [10, 11, 12], (key, steps)
        # Exactly once: each step's command ran one time in the sandbox that holds the result.
        assert r["executed_steps"] == steps, (key, r["executed_steps"])
        want = 1.0 if (r["task"] + r["sample"]) % 3 != 2 else 0.0
        assert r["reward"] == want, (key, r)
    # The step the crash cut off was answered from the log on resume, not run again.
    assert any(s["replayed"] for r in lines for s in r["steps"]), lines
    for task in range(TASKS):
        group = [r for r in lines if r["task"] == task and not r["mask"]]
        assert abs(sum(r["advantage"] for r in group)) < 1e-6
    with warren.Client(node.url) as c:
        assert c.list(labels={"rl-run": run}) == []
