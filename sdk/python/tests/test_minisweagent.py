"""mini-swe-agent on Warren: its own agent loop, driven by its own deterministic test model,
fixes a one-line bug in a small repository inside a Warren sandbox."""

from __future__ import annotations

import os

import pytest
from conftest import Node, need

ENV_CLASS = "warren.integrations.minisweagent.WarrenEnvironment"

SETUP = r"""
set -e
mkdir -p /repo && cd /repo
git init -q
printf 'def add(a, b):\n    return a - b\n' > calc.py
printf 'import calc\nassert calc.add(2, 3) == 5, calc.add(2, 3)\nprint("tests pass")\n' > test_calc.py
git add . && git -c user.email=t@t -c user.name=t commit -qm init
"""


@pytest.fixture
def msa(tmp_path):  # type: ignore[no-untyped-def]
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(tmp_path / "mswea"))
    return need("minisweagent")


def test_its_agent_loop_fixes_a_bug_on_warren(node: Node, msa) -> None:  # type: ignore[no-untyped-def]
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output

    env = get_environment({"environment_class": ENV_CLASS, "url": node.url, "cwd": "/repo", "memory": 128})
    try:
        setup = env.execute({"command": "mkdir -p /repo"}, cwd="/")
        assert setup["returncode"] == 0, setup
        made = env.execute({"command": SETUP}, cwd="/")
        assert made["returncode"] == 0, made
        before = env.execute({"command": "python3 -B test_calc.py"})
        assert before["returncode"] == 1 and "AssertionError" in before["output"], before

        model = DeterministicModel(
            outputs=[
                make_output("Look at the code.", [{"command": "cat calc.py"}]),
                make_output("Fix the operator.", [{"command": "sed -i 's/a - b/a + b/' calc.py"}]),
                make_output("Run the tests.", [{"command": "python3 -B test_calc.py"}]),
                make_output("Submit.", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"}]),
            ]
        )
        agent = DefaultAgent(
            model,
            env,
            system_template="You fix bugs.",
            instance_template="{{task}}",
            step_limit=10,
            cost_limit=0,  # the test model bills 1.0 per call
        )
        result = agent.run("Make test_calc.py pass.")
        assert result["exit_status"] == "Submitted", agent.messages[-1]
        assert "+    return a + b" in result["submission"]
        observations = [m["content"] for m in agent.messages if m.get("role") == "user"]
        assert any("tests pass" in o for o in observations), observations

        after = env.execute({"command": "python3 -B test_calc.py"})
        assert (after["returncode"], after["output"]) == (0, "tests pass\n")
        # stderr comes back in the same stream, in order, as mini-swe-agent expects.
        both = env.execute({"command": "echo out; echo err >&2; exit 4"})
        assert (both["output"], both["returncode"]) == ("out\nerr\n", 4)
        slow = env.execute({"command": "sleep 5"}, timeout=1)
        assert slow["returncode"] == -1 and "timed out" in slow["exception_info"]

        # Every command is one exactly-once step of the sandbox's trajectory.
        steps = [e.get("step") for e in env.sandbox.trajectory() if e.get("kind") == "exec"]
        assert steps == list(range(len(steps))) and len(steps) >= 9, steps
        data = env.serialize()
        assert data["info"]["config"]["environment_type"] == ENV_CLASS
        assert env.get_template_vars()["cwd"] == "/repo"
        sid = env.sandbox_id
    finally:
        env.cleanup()
    import warren

    with warren.Client(node.url) as c:
        with pytest.raises(warren.NotFound):
            c.get(sid)
