"""Harbor on Warren: a Terminal-Bench-2-format task written here runs with Harbor's own oracle
agent (reward 1) and its do-nothing agent (reward 0) in a Warren sandbox whose image the node's
builder made from the task's Dockerfile (once: the second trial finds it), with the network
off as the task asks; the environment's exec (cwd, env, user, timeout), uploads and downloads
work as Harbor calls them; no sandbox is left afterwards.

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
        '[ "$(cat /app/answer.txt 2>/dev/null)" = 5 ] && grep -q seed /app/ready && [ "$TASK_MODE" = test ] && ok=1\n'
        "# the task asked for no network: the sandbox has no interface but loopback (checked\n"
        "# without sending traffic anywhere)\n"
        "python3 -c \"import socket, sys; sys.exit([n for _, n in socket.if_nameindex()] != ['lo'])\" || ok=0\n"
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
        # A context of its own each run: the first trial builds (the image's tag is a digest
        # of the Dockerfile and context), whatever an earlier run left on the node.
        p.write_text(text + (os.urandom(4).hex() + "\n" if rel == "environment/seed.txt" else ""))
        if rel.endswith(".sh"):
            p.chmod(0o755)
    return task


def test_a_terminal_bench_task_on_warren(node: Node, tmp_path: Path) -> None:
    py = harbor_python()
    task = write_task(tmp_path)
    trials = tmp_path / f"trials-{os.urandom(3).hex()}"
    r = subprocess.run(
        [py, str(HERE / "harbor_run.py"), node.url, str(task), str(trials), "oracle", "nop"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(HERE.parent)},
    )
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    with warren.Client(node.url) as c:
        # The image stays on the node for later trials; this test's run removes it.
        for b in {b["image"] for b in out["builds"]}:
            c.delete_image(b)
        assert c.list(labels={"harbor-test": trials.name}) == []
    oracle, nop = out["trials"]
    assert oracle["exception"] is None and oracle["rewards"] == {"reward": 1}, oracle
    assert nop["exception"] is None and nop["rewards"] == {"reward": 0}, nop
    # Built once by the node's builder, then found by the next trial and the probe.
    builds = out["builds"]
    assert [b["built"] for b in builds] == [True, False, False], builds
    assert len({b["image"] for b in builds}) == 1 and builds[0]["image"].startswith("harbor-sum-task:"), builds
    probe = out["probe"]
    assert probe["cwd_env"] == ["/tmp", "test", "x1"], probe
    assert probe["workdir"] == "/app", probe
    assert probe["user"] == "nobody", probe
    assert "timed out" in probe["timeout"], probe
    assert probe["files"] == ["a.txt=A", "tree/a.txt=A", "tree/sub/b.txt=B"], probe
    assert probe["network"] == "unreachable", probe
    with warren.Client(node.url) as c, pytest.raises(warren.NotFound):
        c.get(probe["sandbox"])
