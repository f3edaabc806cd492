"""Harbor on Warren: a Terminal-Bench-2-format task written here runs with Harbor's own oracle
agent (reward 1) and its do-nothing agent (reward 0) in a Warren sandbox built from the task's
Dockerfile, with the network off as the task asks; the sandbox is gone afterwards.

Harbor needs Python ≥ 3.12; scripts/test.sh makes a venv for it (target/venv-harbor) and
names its interpreter in WARREN_HARBOR_PYTHON.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import Node

import warren

HERE = Path(__file__).resolve().parent

TASK = {
    "instruction.md": "Write the sum of 2 and 3 to /app/answer.txt.\n",
    "task.toml": (
        'schema_version = "1.4"\n'
        "[agent]\ntimeout_sec = 120\n"
        "[verifier]\ntimeout_sec = 120\n"
        "[environment]\nallow_internet = false\nmemory_mb = 256\n"
        '[environment.healthcheck]\ncommand = "test -f /app/ready"\n'
    ),
    "environment/Dockerfile": (
        "FROM ubuntu:24.04\n"
        "# the task's image: a working directory, a file from the context, a build step\n"
        "WORKDIR /app\n"
        "COPY seed.txt /app/seed.txt\n"
        "RUN echo ready > /app/ready && \\\n    cat /app/seed.txt >> /app/ready\n"
        "ENV TASK_MODE=test\n"
    ),
    "environment/seed.txt": "seed\n",
    "tests/test.sh": (
        "#!/bin/bash\n"
        "mkdir -p /logs/verifier\n"
        "ok=0\n"
        '[ "$(cat /app/answer.txt 2>/dev/null)" = 5 ] && grep -q seed /app/ready && ok=1\n'
        "# the task asked for no network: nothing outside answers\n"
        "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" 2>/dev/null && ok=0\n"
        "echo $ok > /logs/verifier/reward.txt\n"
    ),
    "solution/solve.sh": "#!/bin/bash\necho $((2 + 3)) > /app/answer.txt\n",
}


def harbor_python() -> str:
    py = os.environ.get("WARREN_HARBOR_PYTHON", "")
    if not py or not Path(py).is_file():
        why = "WARREN_HARBOR_PYTHON does not name a Python ≥ 3.12 with Harbor (scripts/test.sh makes one)"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return py


def write_task(root: Path) -> Path:
    task = root / "sum-task"
    for rel, text in TASK.items():
        p = task / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        if rel.endswith(".sh"):
            p.chmod(0o755)
    return task


@pytest.mark.parametrize("agent,reward", [("oracle", 1), ("nop", 0)])
def test_a_terminal_bench_task_on_warren(node: Node, tmp_path: Path, agent: str, reward: int) -> None:
    py = harbor_python()
    task = write_task(tmp_path)
    trials = tmp_path / f"trials-{agent}-{os.urandom(3).hex()}"
    r = subprocess.run(
        [py, str(HERE / "harbor_run.py"), node.url, str(task), str(trials), agent],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["exception"] is None, out
    assert out["rewards"] == {"reward": reward}, out
    with warren.Client(node.url) as c:
        assert c.list(labels={"harbor-test": trials.name}) == []
