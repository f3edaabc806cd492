#!/usr/bin/env python3
"""A GRPO-style group rollout on Warren, in plain Python, with a scripted policy.

N tasks × K samples. Each task is prepared once in a sandbox (its buggy code and its tests),
then forked into K samples; each sample runs the policy's actions as steps with exactly-once
step numbers, and its reward is the task's tests' verdict. The group's trajectories go to a
JSONL file for a trainer, with group-normalised advantages and a per-rollout infrastructure
verdict:

- ``ok``: the sandbox lived through the rollout;
- ``revived``: the sandbox died (its agent was lost) and was revived from its trajectory (its
  logged calls run again in a new sandbox), and the rollout went on there;
- ``infra-failed``: the sandbox died and could not be revived: the rollout is masked
  (``mask: true``, no reward), so a trainer does not learn from a false zero.

The driver keeps its progress in ``<workdir>/state.json`` (written after every step). Kill it
at any point and run it again with the same ``--workdir``: it asks the same steps again, and
the node answers a step it already ran from the log without running it twice.

    python3 examples/rl/grpo_rollout.py --url unix:///run/warren/warren.sock --workdir /tmp/rl \\
        --tasks 4 --samples 8

The policy is a script (no model, no GPU): sample ``j`` of task ``i`` applies the right fix
unless ``(i + j) % 3 == 2``, so every group has rewards that differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import warren

#: Steps of the prepared (base) sandbox; the samples' own steps start above them.
PREPARE_STEPS = 4
FIRST_SAMPLE_STEP = 10
#: Every step's command first appends its number here: the proof that no step ran twice.
EXECUTED = "/tmp/.executed-steps"


def task_files(i: int) -> Dict[str, str]:
    k = i + 2
    return {
        "/task/solution.py": f"def scale(x):\n    return x * {k} + 1\n",
        "/task/test_solution.py": (
            "import sys\nsys.path.insert(0, '/task')\nimport solution\n"
            f"assert solution.scale(3) == {3 * k}, solution.scale(3)\nprint('pass')\n"
        ),
    }


def policy(task: int, sample: int) -> List[str]:
    """The scripted policy: the shell commands of one sample, in order (the last is the test)."""
    k = task + 2
    right = (task + sample) % 3 != 2
    fix = f"return x * {k}" if right else f"return x * {k} - 1"
    return [
        "cat /task/solution.py",
        f"sed -i 's/return x \\* {k} + 1/{fix}/' /task/solution.py",
        "python3 -B /task/test_solution.py",
    ]


class State:
    """The driver's progress, kept on disk after every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: Dict[str, Any] = {"tasks": {}, "rollouts": {}}
        if path.exists():
            self.data = json.loads(path.read_text())

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        os.replace(tmp, self.path)


class Crash:
    """``--crash-after-steps N``: the driver dies (as a preempted job does) right after its
    N-th step ran on the node and before it recorded it."""

    def __init__(self, after: Optional[int]) -> None:
        self.left = after

    def tick(self) -> None:
        if self.left is None:
            return
        self.left -= 1
        if self.left <= 0:
            sys.stdout.flush()
            os._exit(137)


def step_cmd(step: int, command: str) -> List[str]:
    return ["/bin/sh", "-c", f"echo {step} >> {EXECUTED}; {command}"]


def prepare(client: warren.Client, state: State, task: int, samples: int, labels: Dict[str, str]) -> List[str]:
    """The task's base sandbox and its K forks (each call once, by its step)."""
    t = state.data["tasks"].setdefault(str(task), {})
    if "base" not in t:
        base = client.create("default", memory=128, labels={**labels, "role": "base"})
        t["base"] = base.id
        state.save()
    base = client.get(t["base"])
    base.files.mkdir("/task", step=0)
    for step, (path, content) in enumerate(task_files(task).items(), start=1):
        base.files.write(path, content, step=step)
    children = base.fork(samples, labels={"role": "sample"}, step=PREPARE_STEPS - 1)
    t["children"] = [c.id for c in children]
    state.save()
    return t["children"]


def run_rollout(client: warren.Client, state: State, key: str, crash: Crash) -> None:
    r = state.data["rollouts"][key]
    actions = policy(r["task"], r["sample"])
    while r["next"] < len(actions) and r["verdict"] != "infra-failed":
        i = r["next"]
        step = FIRST_SAMPLE_STEP + i
        try:
            sb = client.get(r["sandbox"])
            res = sb.exec(step_cmd(step, actions[i]), step=step, timeout=60)
        except (warren.SandboxLost, warren.NotFound, warren.InvalidState) as e:
            # The sandbox died under the rollout: revive it from its trajectory, or mask it.
            try:
                report = client.revive(r["sandbox"])
            except warren.WarrenError as why:
                r["verdict"] = "infra-failed"
                r["error"] = f"{type(e).__name__}; revive failed: {why}"
                state.save()
                break
            r["revived_from"].append(r["sandbox"])
            r["sandbox"] = report.sandbox.id
            r["verdict"] = "revived"
            state.save()
            continue
        crash.tick()
        r["steps"].append(
            {
                "step": step,
                "action": actions[i],
                "observation": res.stdout + res.stderr,
                "exit_code": res.exit_code,
                "replayed": res.replayed,
            }
        )
        r["next"] = i + 1
        state.save()
    if r["verdict"] == "infra-failed":
        r["reward"] = None
    elif r["next"] == len(actions):
        r["reward"] = 1.0 if r["steps"][-1]["exit_code"] == 0 else 0.0
        sb = client.get(r["sandbox"])
        executed = sb.files.read(EXECUTED).decode().split()
        r["executed_steps"] = [int(s) for s in executed]
    state.save()


def export(state: State, out: Path) -> None:
    by_task: Dict[int, List[Dict[str, Any]]] = {}
    for r in state.data["rollouts"].values():
        by_task.setdefault(r["task"], []).append(r)
    with open(out, "w") as f:
        for task, group in sorted(by_task.items()):
            rewards = [r["reward"] for r in group if r["verdict"] != "infra-failed"]
            mean = statistics.fmean(rewards) if rewards else 0.0
            std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
            for r in sorted(group, key=lambda r: r["sample"]):
                masked = r["verdict"] == "infra-failed"
                line = {
                    "task": task,
                    "sample": r["sample"],
                    "sandbox": r["sandbox"],
                    "revived_from": r["revived_from"],
                    "verdict": r["verdict"],
                    "mask": masked,
                    "reward": r["reward"],
                    "advantage": 0.0 if masked else (r["reward"] - mean) / (std + 1e-6),
                    "steps": r["steps"],
                    "executed_steps": r.get("executed_steps"),
                }
                if "error" in r:
                    line["error"] = r["error"]
                f.write(json.dumps(line) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="Warren node or gateway (default WARREN_URL)")
    p.add_argument("--workdir", required=True, type=Path)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--run", default="rl", help="label value marking this run's sandboxes")
    p.add_argument("--crash-after-steps", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="leave the sandboxes for inspection")
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    state = State(a.workdir / "state.json")
    crash = Crash(a.crash_after_steps)
    labels = {"rl-run": a.run}
    with warren.Client(a.url) as client:
        for task in range(a.tasks):
            t = state.data["tasks"].get(str(task), {})
            children = t.get("children") or prepare(client, state, task, a.samples, labels)
            for sample, sid in enumerate(children):
                state.data["rollouts"].setdefault(
                    f"{task}/{sample}",
                    {
                        "task": task,
                        "sample": sample,
                        "sandbox": sid,
                        "next": 0,
                        "steps": [],
                        "verdict": "ok",
                        "revived_from": [],
                        "reward": None,
                    },
                )
            state.save()
        for key in sorted(state.data["rollouts"]):
            run_rollout(client, state, key, crash)
        export(state, a.workdir / "rollouts.jsonl")
        if not a.keep:
            client.delete_all(labels=labels)
    print(f"wrote {a.workdir / 'rollouts.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
