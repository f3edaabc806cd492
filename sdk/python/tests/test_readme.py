"""The READMEs' examples run as written against the session's node.

Every ``python`` block of the SDK's README, and every ``sh`` block of the repository's README
(in an empty directory, as one bash script that stops at the first failing line). The ``sh``
blocks run as a user after ``./scripts/up.sh`` would: with the ``PATH`` of a login shell
(``/etc/login.defs``) and nothing else, after the install step ``up.sh`` runs
(``scripts/install-bin.sh``, linking the build into ``/usr/local/bin``). That step runs in a
mount namespace of the block's own where ``/usr/local/bin`` is an overlay, so the host's
directory is left as it was. ``console`` blocks (installing a node, long or interactive
commands) are not run here; CI runs the install commands themselves.
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


REPO = Path(__file__).resolve().parents[3]


def login_path() -> str:
    """The PATH a login shell of root gets (``ENV_SUPATH`` of ``/etc/login.defs``)."""
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "ENV_SUPATH" and parts[1].startswith("PATH="):
                return parts[1][len("PATH=") :]
    except OSError:
        pass
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


# In a mount namespace of its own: /usr/local/bin becomes an overlay whose writes go to a
# scratch directory, up.sh's install step runs, then the block with a login shell's
# environment (PATH, HOME, the daemon's address) and nothing of the test's.
AS_A_USER = r"""
set -euo pipefail
mkdir -p "$SCRATCH/upper" "$SCRATCH/work"
mount -t overlay overlay -o "lowerdir=/usr/local/bin,upperdir=$SCRATCH/upper,workdir=$SCRATCH/work" /usr/local/bin
"$REPO/scripts/install-bin.sh" --from "$BIN" > /dev/null
exec env -i HOME="$HOME" LANG=C.UTF-8 PATH="$USER_PATH" WARREN_URL="$WARREN_URL"     bash -euo pipefail -c "$BLOCK"
"""


def test_install_step_puts_warren_on_a_login_path(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "install-bin.sh"), "--from", str(BIN_DIR), "--to", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "warren").resolve() == (BIN_DIR / "warren").resolve()
    assert "/usr/local/bin" in login_path().split(":")
    assert "scripts/install-bin.sh" in (REPO / "scripts" / "up.sh").read_text()


@pytest.mark.parametrize("index", range(len(sh_blocks())))
def test_main_readme_example(index: int, url: str, tmp_path: Path) -> None:
    script = sh_blocks()[index]
    work = tmp_path / "work"
    work.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "SCRATCH": str(tmp_path / "overlay"),
        "REPO": str(REPO),
        "BIN": str(BIN_DIR),
        "HOME": os.environ.get("HOME", "/root"),
        "USER_PATH": login_path(),
        "WARREN_URL": url,
        "BLOCK": script,
    }
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", AS_A_USER],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=work,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, f"README block {index} failed:\n{out.stdout}\n{out.stderr}"
