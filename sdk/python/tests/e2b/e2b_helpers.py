"""Helpers of the E2B compatibility tests: E2B's own SDK (the ``e2b`` package, pinned in
``sdk/python/pyproject.toml``) against a private ``warrend --e2b`` on loopback.

The node listens on a free loopback port; the SDK is pointed at it the way a user of an E2B
server other than E2B's cloud does: ``api_url`` (``E2B_API_URL``) and ``sandbox_url``
(``E2B_SANDBOX_URL``) both name it, ``domain`` is the node's ``--e2b-domain``. Without
``--auth`` any API key is the node's administrator.

Tests skip, saying why, when not root or when the binaries or the ``e2b`` package are
missing, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest


def _base() -> Any:
    """The suite's own conftest (its node helpers), loaded under a name of its own: both files
    are called ``conftest`` and pytest imports this one under that name."""
    name = "warren_tests_base"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "conftest.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


_b = _base()
BIN_DIR = _b.BIN_DIR
Node = _b.Node
_why_not = _b._why_not
node_name = _b.node_name
start_node = _b.start_node
stop_node = _b.stop_node

#: The ``--e2b-domain`` of the test nodes: hosts ``{port}-{id}.e2b.test`` reach sandbox ports.
DOMAIN = "e2b.test"


def why_not_e2b() -> Optional[str]:
    why = _why_not()
    if why:
        return why
    try:
        import e2b  # noqa: F401
    except ImportError as e:
        return f"the e2b package is not installed ({e}): pip install -e 'sdk/python[test]' (Python 3.11+)"
    return None


def need_e2b() -> None:
    why = why_not_e2b()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"E2B tests cannot run under CI: {why}")
        pytest.skip(why)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


class E2bNode:
    """A warrend serving E2B's API on a loopback port."""

    def __init__(self, node: Node, port: int) -> None:
        self.node = node
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def opts(self, **extra: Any) -> Dict[str, Any]:
        """Connection options for every SDK call."""
        return {
            "api_url": self.base,
            "sandbox_url": self.base,
            "api_key": "e2b_warren_test",
            "domain": DOMAIN,
            **extra,
        }


def start_e2b_node(tmp: Path, *extra: str) -> E2bNode:
    port = free_port()
    node = start_node(
        tmp,
        node_name("e2b"),
        "--e2b",
        "--e2b-domain",
        DOMAIN,
        "--listen",
        f"127.0.0.1:{port}",
        "--max-sandboxes",
        "500",
        *extra,
    )
    return E2bNode(node, port)




def stop_e2b_node(n: E2bNode) -> None:
    stop_node(n.node)
