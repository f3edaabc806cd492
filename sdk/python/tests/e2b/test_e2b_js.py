"""E2B's JS SDK (the ``e2b`` npm package, pinned with its lock file in ``js/``) under Node
against the session's ``warrend --e2b``: create, run, files, list, kill (``js/smoke.mjs``).

The packages are installed once into ``target/e2b-js`` (``npm ci`` from the committed lock,
again whenever the lock changes). Needs Node.js 20.18+ and npm; under ``CI=true`` a missing
one fails the test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from e2b_helpers import DOMAIN

HERE = Path(__file__).resolve().parent / "js"
REPO = Path(__file__).resolve().parents[4]
CACHE = REPO / "target" / "e2b-js"


def _install() -> Path:
    lock = (HERE / "package-lock.json").read_bytes()
    stamp = CACHE / ".installed-lock"
    if not (stamp.is_file() and stamp.read_bytes() == lock and (CACHE / "node_modules" / "e2b").is_dir()):
        CACHE.mkdir(parents=True, exist_ok=True)
        for f in ("package.json", "package-lock.json"):
            shutil.copy(HERE / f, CACHE / f)
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=CACHE,
            check=True,
            timeout=600,
        )
        stamp.write_bytes(lock)
    shutil.copy(HERE / "smoke.mjs", CACHE / "smoke.mjs")
    return CACHE / "smoke.mjs"


def _need_node() -> None:
    missing = [t for t in ("node", "npm") if not shutil.which(t)]
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"cannot run under CI: {missing} not installed")
        pytest.skip(f"{missing} not installed")


def _node(script: Path, e2b_node: Any) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "E2B_API_URL": e2b_node.base,
        "E2B_SANDBOX_URL": e2b_node.base,
        "E2B_DOMAIN": DOMAIN,
        "E2B_API_KEY": "e2b_warren_test",
    }
    r = subprocess.run(["node", str(script)], cwd=CACHE, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def test_the_js_sdk_creates_runs_and_kills(e2b_node: Any) -> None:
    _need_node()
    r = _node(_install(), e2b_node)
    assert '"ok":true' in r.stdout


def test_the_js_example_of_the_docs_runs(e2b_node: Any) -> None:
    """docs/e2b.md's JavaScript example, as written (the Python one: test_e2b_docs.py)."""
    from test_e2b_docs import example

    _need_node()
    _install()
    script = CACHE / "docs-example.mjs"
    script.write_text(example("js"))
    out = _node(script, e2b_node).stdout
    for line in ["hi from /tmp", "exit code 3", "later", "hello", "[ 'hello.txt' ]", f".{DOMAIN}"]:
        assert line in out, (line, out)
