"""The READMEs' examples run as written against the session's node.

Every ``python`` block of the SDK's README, and every ``sh`` block of the repository's README
(with the ``warren`` of ``$WARREN_BIN_DIR`` on ``PATH``, in an empty directory, as one bash
script that stops at the first failing line). ``console`` blocks (installing a node, long or
interactive commands) are not run here; CI runs the install commands themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BIN_DIR

README = Path(__file__).resolve().parents[1] / "README.md"
MAIN_README = Path(__file__).resolve().parents[3] / "README.md"


def blocks() -> list:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(blocks())))
def test_readme_example(index: int, url: str) -> None:
    code = blocks()[index]
    env = {**os.environ, "WARREN_URL": url}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr
    if "mean reward" in code:
        assert "mean reward 1.00" in out.stdout
    else:
        assert "0 42" in out.stdout


def sh_blocks() -> list:
    return re.findall(r"```sh\n(.*?)```", MAIN_README.read_text(), re.S)


def test_main_readme_has_runnable_blocks() -> None:
    assert len(sh_blocks()) >= 2


@pytest.mark.parametrize("index", range(len(sh_blocks())))
def test_main_readme_example(index: int, url: str, tmp_path: Path) -> None:
    script = sh_blocks()[index]
    env = {
        **os.environ,
        "WARREN_URL": url,
        "PATH": f"{BIN_DIR}:{os.environ.get('PATH', '')}",
    }
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"README block {index} failed:\n{out.stdout}\n{out.stderr}"
