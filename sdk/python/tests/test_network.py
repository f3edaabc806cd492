"""Network policy through the SDK: set at create, read, changed at run time. No traffic is
sent; the policy names private ranges nobody answers on (the attack cases are in
tests/security/network.rs)."""

from __future__ import annotations

import pytest

import warren


async def test_network_policy_lifecycle(aclient: warren.AsyncClient) -> None:
    policy = warren.network_policy(allow=["10.254.253.0/24:443:tcp"], domains=["files.example.test"])
    sb = await aclient.create(network=policy, labels={"suite": "py", "case": "network"})
    async with sb:
        assert isinstance(sb.info.network, dict) and sb.info.network["mode"] == "allow"
        st = await sb.network()
        assert st["address"] and st["gateway"]
        assert st["policy"]["allow"] == [{"cidr": "10.254.253.0/24", "ports": 443, "protocol": "tcp"}]
        r = await sb.exec("cat /etc/resolv.conf; ls /sys/class/net")
        assert f"nameserver {st['gateway']}" in r.stdout and "eth0" in r.stdout
        with pytest.raises(warren.InvalidRequest):
            await sb.set_network(services={"no-such-service": True})
        st = await sb.set_network("none")
        assert st["address"] is None and sb.info.network == "none"
        r = await sb.exec("ls /sys/class/net")
        assert r.stdout.split() == ["lo"]
        st = await sb.set_network(allow=[{"cidr": "10.254.253.7", "ports": "8000-8100"}])
        assert st["address"]
        assert (await sb.refresh()).network["allow"][0]["ports"] == "8000-8100"


def test_network_policy_builder() -> None:
    assert warren.network_policy() == "none"
    assert warren.network_policy("none") == "none"
    p = warren.network_policy(allow=["10.1.0.0/16", "10.2.0.1:53:udp"], services={"pypi": True})
    assert p == {
        "mode": "allow",
        "allow": [{"cidr": "10.1.0.0/16"}, {"cidr": "10.2.0.1", "ports": 53, "protocol": "udp"}],
        "services": {"pypi": True},
        "domains": [],
    }
    with pytest.raises(ValueError):
        warren.network_policy("none", domains=["a.test"])
