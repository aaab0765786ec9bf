"""The egress router without namespaces: its rules say what they must, its slots' addresses,
and where it cannot be made (not root, no nft) it says why (the launcher then gives each
group a pasta of its own). The real router: tests/integration/backends/test_egress_router.py."""

from __future__ import annotations

import ipaddress

import pytest

from trainyard.backends.local import router as router_mod
from trainyard.backends.local.router import (
    GROUP_IFNAME_PREFIX,
    GROUP_NETWORK,
    ROUTER_IFNAME,
    RULES,
    SLOT_COUNT,
    probe_router,
    slot_addresses,
)


def _chain(name: str) -> list[str]:
    body = RULES.split(f"chain {name} {{", 1)[1].split("}", 1)[0]
    return [line.strip() for line in body.strip().splitlines()]


def test_forwarding_goes_from_a_group_to_pasta_only() -> None:
    forward = _chain("forward")
    assert "policy drop;" in forward[0]
    assert f'iifname "{GROUP_IFNAME_PREFIX}*" oifname "{ROUTER_IFNAME}" accept' in forward
    assert (
        f'iifname "{ROUTER_IFNAME}" oifname "{GROUP_IFNAME_PREFIX}*" '
        "ct state established,related accept"
    ) in forward
    assert not any(
        "accept" in rule
        for rule in forward
        if f'oifname "{GROUP_IFNAME_PREFIX}*"' in rule and "established" not in rule
    )


def test_nothing_from_a_group_reaches_the_router_itself() -> None:
    rules = _chain("input")
    assert "policy drop;" in rules[0]
    assert [r for r in rules if "accept" in r] == ['iif "lo" accept']


def test_no_posing_and_masquerade_only_towards_pasta() -> None:
    assert f'iifname "{GROUP_IFNAME_PREFIX}*" fib saddr . iif oif missing drop' in _chain(
        "prerouting"
    )
    assert _chain("postrouting")[1:] == [f'oifname "{ROUTER_IFNAME}" masquerade']


def test_slots_are_distinct_31s_of_the_group_network() -> None:
    assert slot_addresses(0) == ("100.64.0.0", "100.64.0.1")
    assert slot_addresses(SLOT_COUNT - 1) == ("100.64.255.254", "100.64.255.255")
    seen = {a for slot in (0, 1, 127, 128, SLOT_COUNT - 1) for a in slot_addresses(slot)}
    assert len(seen) == 10
    assert all(ipaddress.IPv4Address(a) in GROUP_NETWORK for a in seen)
    assert len(f"{GROUP_IFNAME_PREFIX}{SLOT_COUNT - 1}") <= 15  # IFNAMSIZ - 1


def test_without_root_or_nft_the_probe_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router_mod.os, "geteuid", lambda: 1000)
    assert "not root" in (probe_router() or "")
    monkeypatch.setattr(router_mod.os, "geteuid", lambda: 0)
    monkeypatch.setattr(router_mod.shutil, "which", lambda name: None)
    assert probe_router() == "nft is not installed (Debian package nftables)"
