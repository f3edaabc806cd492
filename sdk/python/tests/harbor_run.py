"""Runs Harbor trials of a task on Warren, then drives the environment class directly, and
prints what happened as JSON (one line).

Run by test_harbor.py with the Python ≥ 3.12 venv that holds Harbor (scripts/test.sh makes
it): ``python harbor_run.py URL TASK_DIR TRIALS_DIR AGENT [AGENT ...]``. The output has
``trials`` (per agent: rewards, exception), ``builds`` (the adapter's image builds, in order)
and ``probe`` (exec with cwd, env, user and timeout; uploads and downloads; stop).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict

from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.task.task import Task
from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.trial.trial import Trial

from warren.integrations import harbor as adapter


def kwargs(url: str, trials: str) -> Dict[str, Any]:
    return {"url": url, "base_images": {"*": "default"}, "labels": {"harbor-test": Path(trials).name}}


async def trial(url: str, task: str, trials: str, agent: str) -> Dict[str, Any]:
    config = TrialConfig(
        task=TaskConfig(path=Path(task)),
        trials_dir=Path(trials),
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(
            import_path="warren.integrations.harbor:WarrenEnvironment",
            kwargs=kwargs(url, trials),
        ),
    )
    result = await (await Trial.create(config)).run()
    rewards = result.verifier_result.rewards if result.verifier_result else None
    exc = result.exception_info.model_dump(mode="json") if result.exception_info else None
    return {"agent": agent, "rewards": rewards, "exception": exc}


async def probe(url: str, task_dir: str, trials: str) -> Dict[str, Any]:
    """The environment's calls as an agent or verifier makes them."""
    task = Task(Path(task_dir))
    out: Dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        paths = TrialPaths(tmp / "trial")
        paths.mkdir()
        env = adapter.WarrenEnvironment(
            environment_dir=task.paths.environment_dir,
            environment_name=task.short_name,
            session_id="probe",
            trial_paths=paths,
            task_env_config=task.config.environment,
            # What a trial passes for a task without internet (the trial derives it).
            network_policy=NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
            **kwargs(url, trials),
        )
        await env.start(force_build=False)
        try:
            r = await env.exec("pwd; echo $TASK_MODE $X", cwd="/tmp", env={"X": "x1"})
            out["cwd_env"] = r.stdout.split()
            out["workdir"] = (await env.exec("pwd")).stdout.strip()
            out["user"] = (await env.exec("id -un", user="nobody")).stdout.strip()
            try:
                await env.exec("sleep 30", timeout_sec=1)
                out["timeout"] = "no timeout"
            except RuntimeError as e:
                out["timeout"] = str(e)
            (tmp / "up").mkdir()
            (tmp / "up" / "a.txt").write_text("A")
            (tmp / "up" / "sub").mkdir()
            (tmp / "up" / "sub" / "b.txt").write_text("B")
            await env.upload_file(tmp / "up" / "a.txt", "/data/one/a.txt")
            await env.upload_dir(tmp / "up", "/data/tree")
            await env.download_file("/data/one/a.txt", tmp / "down" / "a.txt")
            await env.download_dir("/data/tree", tmp / "down" / "tree")
            out["files"] = sorted(
                f"{p.relative_to(tmp / 'down').as_posix()}={p.read_text()}"
                for p in (tmp / "down").rglob("*")
                if p.is_file()
            )
            out["network"] = (
                await env.exec(
                    # No interface but loopback: nothing outside is reachable (no traffic sent).
                    "python3 -c \"import socket, sys; sys.exit([n for _, n in socket.if_nameindex()] != ['lo'])\""
                    " && echo unreachable || echo reached"
                )
            ).stdout.strip()
            sandbox_id = env.sandbox.id
        finally:
            await env.stop(delete=True)
        out["sandbox"] = sandbox_id
    return out


async def main(url: str, task: str, trials: str, *agents: str) -> None:
    results = [await trial(url, task, trials, a) for a in agents]
    checks = await probe(url, task, trials)
    print(json.dumps({"trials": results, "builds": adapter.builds, "probe": checks}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
