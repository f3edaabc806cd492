"""The examples of ``docs/e2b.md`` run as written: its Python example (a subprocess with the
``E2B_*`` variables of the session's node, as the page tells users to set them) prints what
its comments say; its JavaScript example runs in ``test_e2b_js.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from e2b_helpers import DOMAIN

DOCS = Path(__file__).resolve().parents[4] / "docs" / "e2b.md"


def example(lang: str) -> str:
    """The fenced ``lang`` block of the page's Examples section."""
    text = DOCS.read_text()
    section = text[text.index("## Examples") :]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"docs/e2b.md has no {lang} example"
    return m.group(1)


def env_of(e2b_node: Any) -> Dict[str, str]:
    return {
        **os.environ,
        "E2B_API_URL": e2b_node.base,
        "E2B_SANDBOX_URL": e2b_node.base,
        "E2B_DOMAIN": DOMAIN,
        "E2B_API_KEY": "e2b_warren_test",
    }


def test_the_python_example_runs(e2b_node: Any) -> None:
    r = subprocess.run(
        [sys.executable, "-c", example("python")], env=env_of(e2b_node), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    out = r.stdout
    for line in ["hi from /tmp", "exit code 3", "stdout: one\nstdout: two", "fed through stdin", "200 served from inside", "True"]:
        assert line in out, (line, out)
    assert "hello ['hello.txt']" in out
