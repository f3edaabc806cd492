"""The README's examples run as written against the session's node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


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
