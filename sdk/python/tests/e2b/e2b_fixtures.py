"""Fixtures of the E2B compatibility tests (helpers in ``e2b_helpers``; registered as a plugin
by ``tests/conftest.py``, as a second ``conftest`` module would shadow the first): a session node
running ``warrend --e2b``, the SDK's connection options for it, and a sandbox per test."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator

import pytest
from e2b_helpers import E2bNode, need_e2b, start_e2b_node, stop_e2b_node


@pytest.fixture(scope="session")
def e2b_node() -> Iterator[E2bNode]:
    """The session's warrend with ``--e2b`` (no ``--auth``)."""
    need_e2b()
    tmp = Path(tempfile.mkdtemp(prefix="warren-e2b-"))
    n = start_e2b_node(tmp)
    try:
        yield n
    finally:
        stop_e2b_node(n)


@pytest.fixture
def opts(e2b_node: E2bNode) -> Dict[str, Any]:
    return e2b_node.opts()


@pytest.fixture
def e2b_sandbox(opts: Dict[str, Any]) -> Iterator[Any]:
    """One sandbox made through E2B's SDK, killed afterwards."""
    from e2b import Sandbox

    sb = Sandbox.create(timeout=300, metadata={"suite": "e2b"}, **opts)
    try:
        yield sb
    finally:
        sb.kill()

