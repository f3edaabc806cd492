"""E2B's API under ``--auth``: the API key is a Warren token; no key or a bad one is E2B's
``401``; tenants see only their own sandboxes (another's is not found); a tenant quota is
E2B's rate-limit answer (``429``); envd requests need the sandbox's own access token."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterator

import httpx
import pytest
from e2b_helpers import E2bNode, need_e2b, start_e2b_node, stop_e2b_node

TOKENS = {"a": "tok-a-" + "x" * 20, "b": "tok-b-" + "y" * 20, "root": "tok-root-" + "z" * 20}


def _auth_file(path: Path) -> None:
    def h(t: str) -> str:
        return hashlib.sha256(t.encode()).hexdigest()

    path.write_text(
        f'[[tenant]]\nname = "a"\nrole = "user"\ntoken_sha256 = ["{h(TOKENS["a"])}"]\nmax_sandboxes = 1\n\n'
        f'[[tenant]]\nname = "b"\nrole = "user"\ntoken_sha256 = ["{h(TOKENS["b"])}"]\n\n'
        f'[[tenant]]\nname = "root"\nrole = "admin"\ntoken_sha256 = ["{h(TOKENS["root"])}"]\n'
    )


@pytest.fixture(scope="module")
def auth_node() -> Iterator[E2bNode]:
    need_e2b()
    tmp = Path(tempfile.mkdtemp(prefix="warren-e2b-auth-"))
    auth = tmp / "auth.toml"
    _auth_file(auth)
    n = start_e2b_node(tmp, "--auth", str(auth))
    try:
        yield n
    finally:
        from e2b import Sandbox

        # stop_node's cleanup goes through the Unix socket as root (the administrator).
        for s in Sandbox.list(**n.opts(api_key=TOKENS["root"])).next_items():
            Sandbox.kill(s.sandbox_id, **n.opts(api_key=TOKENS["root"]))
        stop_e2b_node(n)


def as_(n: E2bNode, who: str) -> Dict[str, Any]:
    return n.opts(api_key=TOKENS[who], retries=0)


def test_no_key_or_a_bad_key_is_401(auth_node: E2bNode) -> None:
    from e2b import AuthenticationException, Sandbox

    r = httpx.post(f"{auth_node.base}/v2/sandboxes", json={"templateID": "base"})
    assert r.status_code == 401
    assert r.json()["code"] == 401 and "API key" in r.json()["message"]
    with pytest.raises(AuthenticationException):
        Sandbox.create(**auth_node.opts(api_key="not-a-token"))
    with pytest.raises(AuthenticationException):
        Sandbox.list(**auth_node.opts(api_key="not-a-token")).next_items()


def test_tenants_see_their_own_and_quotas_are_429(auth_node: E2bNode) -> None:
    from e2b import NotFoundException, RateLimitException, Sandbox

    sb = Sandbox.create(timeout=120, metadata={"who": "a"}, **as_(auth_node, "a"))
    try:
        assert [s.sandbox_id for s in Sandbox.list(**as_(auth_node, "a")).next_items()] == [sb.sandbox_id]
        assert Sandbox.list(**as_(auth_node, "b")).next_items() == []
        with pytest.raises(NotFoundException):
            Sandbox.get_info(sb.sandbox_id, **as_(auth_node, "b"))
        with pytest.raises(NotFoundException):
            Sandbox.connect(sb.sandbox_id, **as_(auth_node, "b"))
        assert Sandbox.kill(sb.sandbox_id, **as_(auth_node, "b")) is False
        # Tenant a may hold one sandbox.
        with pytest.raises(RateLimitException) as e:
            Sandbox.create(timeout=60, **as_(auth_node, "a"))
        assert "max_sandboxes" in str(e.value)
    finally:
        sb.kill()


def test_envd_needs_the_sandboxs_own_token(auth_node: E2bNode) -> None:
    from e2b import Sandbox

    sb = Sandbox.create(timeout=120, **as_(auth_node, "b"))
    other = Sandbox.create(timeout=120, **as_(auth_node, "b"))
    try:
        health = f"{auth_node.base}/health"
        head = {"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "49983"}
        assert httpx.get(health, headers=head).status_code == 401
        # Neither the tenant's key nor another sandbox's token opens it.
        assert httpx.get(health, headers={**head, "X-Access-Token": TOKENS["b"]}).status_code == 401
        assert httpx.get(health, headers={**head, "X-Access-Token": other._envd_access_token}).status_code == 401
        assert httpx.get(health, headers={**head, "X-Access-Token": sb._envd_access_token}).status_code != 401
    finally:
        sb.kill()
        other.kill()
