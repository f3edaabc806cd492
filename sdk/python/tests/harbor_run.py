"""Runs one Harbor trial of a task on Warren and prints its result as JSON (one line).

Run by test_harbor.py with the Python ≥ 3.12 venv that holds Harbor (scripts/test.sh makes
it): ``python harbor_run.py URL TASK_DIR TRIALS_DIR AGENT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from harbor.models.trial.config import AgentConfig, EnvironmentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial


async def main(url: str, task: str, trials: str, agent: str) -> None:
    config = TrialConfig(
        task=TaskConfig(path=Path(task)),
        trials_dir=Path(trials),
        agent=AgentConfig(name=agent),
        environment=EnvironmentConfig(
            import_path="warren.integrations.harbor:WarrenEnvironment",
            kwargs={"url": url, "base_images": {"*": "default"}, "labels": {"harbor-test": Path(trials).name}},
        ),
    )
    trial = await Trial.create(config)
    result = await trial.run()
    rewards = result.verifier_result.rewards if result.verifier_result else None
    exc = result.exception_info.model_dump(mode="json") if result.exception_info else None
    print(json.dumps({"rewards": rewards, "exception": exc}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
