"""The launcher's egress router: one pasta for all the groups of a launcher.

pasta is started once, attached to a *router* network namespace that the launcher holds; each
group's namespace gets a veth pair to it (``tyg<N>`` on the router, ``eth0`` in the group, a
/31 of ``GROUP_NETWORK``). ``RULES`` (nftables, loaded once) let a group reach pasta's
interface only: no group-to-group traffic, nothing to the router itself, reverse-path
filtered, masqueraded on the way out. A group's veth goes with its namespace; router and pasta
go with the launcher. Needs root (CAP_NET_ADMIN) and ``nft``; where either is missing the
launcher gives each group a pasta of its own (``probe_router`` says why), never a router
without its rules. Layout, rules and addresses: docs/local-backend.md, "Egress router".
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.backends.local import netns
from trainyard.backends.local.rtnl import Netlink
from trainyard.errors import BackendError

__all__ = [
    "EgressRouter",
    "GroupLink",
    "probe_router",
    "slot_addresses",
    "RULES",
    "GROUP_NETWORK",
    "ROUTER_IFNAME",
    "GROUP_IFNAME",
    "GROUP_IFNAME_PREFIX",
]

ROUTER_IFNAME = "tyup"
"""pasta's interface in the router namespace."""
GROUP_IFNAME = "eth0"
GROUP_IFNAME_PREFIX = "tyg"
GROUP_NETWORK = ipaddress.IPv4Network("100.64.0.0/16")
SLOT_COUNT = GROUP_NETWORK.num_addresses // 2
ROUTER_FIRST_INDEX = 100
GROUP_INDEX = 2
VETH_MTU = 65520  # pasta's tap MTU: no fragmentation between a group and pasta
NFT_TIMEOUT_S = 10.0

RULES = f"""\
table inet trainyard_egress {{
  chain prerouting {{
    type filter hook prerouting priority raw; policy accept;
    iifname "{GROUP_IFNAME_PREFIX}*" fib saddr . iif oif missing drop
  }}
  chain input {{
    type filter hook input priority filter; policy drop;
    iif "lo" accept
    iifname "{GROUP_IFNAME_PREFIX}*" reject with icmpx type admin-prohibited
  }}
  chain forward {{
    type filter hook forward priority filter; policy drop;
    iifname "{GROUP_IFNAME_PREFIX}*" oifname "{ROUTER_IFNAME}" accept
    iifname "{ROUTER_IFNAME}" oifname "{GROUP_IFNAME_PREFIX}*" ct state established,related accept
    iifname "{GROUP_IFNAME_PREFIX}*" reject with icmpx type admin-prohibited
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname "{ROUTER_IFNAME}" masquerade
  }}
}}
"""
"""The router namespace's nftables rules (see the module docstring)."""

_SYSCTLS = {
    "net/ipv4/ip_forward": "1",
    "net/ipv6/conf/all/disable_ipv6": "1",
    "net/ipv6/conf/default/disable_ipv6": "1",
}


def probe_router() -> str | None:
    """None when this process may make an egress router, else why not (then each group gets
    a pasta of its own)."""
    if os.geteuid() != 0:
        return "not root (a veth between namespaces needs CAP_NET_ADMIN in both)"
    if shutil.which("nft") is None:
        return "nft is not installed (Debian package nftables)"
    return netns.probe_egress()


@dataclass(frozen=True)
class GroupLink:
    """A group's veth to the router: slot, the router end's ifindex, both addresses."""

    slot: int
    router_index: int
    router_address: str
    group_address: str


def slot_addresses(slot: int) -> tuple[str, str]:
    """(router end, group end) addresses of ``slot``, a /31 of ``GROUP_NETWORK``."""
    return str(GROUP_NETWORK[2 * slot]), str(GROUP_NETWORK[2 * slot + 1])


@dataclass
class EgressRouter:
    """A live router: its namespace (descriptor ``ns_fd``), a netlink socket in it, pasta.
    Not thread-safe: the launcher's main thread uses it."""

    ns_fd: int
    netlink: Netlink
    pasta: subprocess.Popen[bytes]
    links: dict[int, GroupLink] = field(default_factory=dict)
    _next_slot: int = 0

    @classmethod
    def make(cls) -> EgressRouter:
        """Make the namespace, load ``RULES``, attach pasta and wait until it is ready. Call
        it from the thread whose end should end pasta (the launcher's main thread).

        Raises:
            BackendError: the namespace, the rules or pasta failed (nothing is left behind).
        """
        try:
            ns_fd, netlink = netns.on_own_thread(_make_namespace, "egress-router")
        except OSError as exc:
            raise BackendError(f"could not make the egress router: {exc}") from exc
        try:
            pasta = netns.start_egress(ns_fd=ns_fd, ifname=ROUTER_IFNAME)
        except BackendError:
            netlink.close()
            os.close(ns_fd)
            raise
        return cls(ns_fd, netlink, pasta)

    def alive(self) -> bool:
        """Whether its pasta still runs."""
        return self.pasta.poll() is None

    def attach(self, group_ns_fd: int) -> GroupLink:
        """Give the namespace of descriptor ``group_ns_fd`` (fresh: only ``lo``) a veth to the
        router, its address and default route.

        Raises:
            OSError: the kernel refused (the group's half-made link goes with its namespace).
        """
        link = self._add_pair(group_ns_fd)
        self.links[link.slot] = link
        try:
            self.netlink.add_address(link.router_index, link.router_address, 31)
            netns.on_this_thread(lambda: _configure_group(group_ns_fd, link))
        except OSError:
            self.detach(link, now=True)
            raise
        return link

    def _add_pair(self, group_ns_fd: int) -> GroupLink:
        for _ in range(SLOT_COUNT):
            slot = self._next_slot
            self._next_slot = (slot + 1) % SLOT_COUNT
            if slot in self.links:
                continue
            index = ROUTER_FIRST_INDEX + slot
            try:
                self.netlink.add_veth(
                    f"{GROUP_IFNAME_PREFIX}{slot}",
                    index,
                    GROUP_IFNAME,
                    GROUP_INDEX,
                    group_ns_fd,
                    VETH_MTU,
                )
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.EBUSY):  # still being torn down
                    continue
                raise
            return GroupLink(slot, index, *slot_addresses(slot))
        raise OSError(errno.ENOSPC, f"all {SLOT_COUNT} egress router slots are in use")

    def detach(self, link: GroupLink, now: bool = False) -> None:
        """The group is gone: free its slot. Its veth goes with its namespace (the kernel
        removes both ends when the namespace is torn down, off this thread); with ``now``,
        it is deleted here (~20 ms of wall time, mostly waiting in ``synchronize_net``:
        for a half-made group, not for every drop). Idempotent."""
        self.links.pop(link.slot, None)
        if now:
            with contextlib.suppress(OSError):
                self.netlink.delete_link(link.router_index)

    def close(self) -> None:
        """End pasta and let the namespace go (every group's veth with it). Idempotent."""
        netns.stop_egress(self.pasta)
        self.netlink.close()
        with contextlib.suppress(OSError):
            os.close(self.ns_fd)
        self.links.clear()


def _make_namespace() -> tuple[int, Netlink]:
    """On a thread of its own: a new network namespace with ``lo`` up, forwarding on, IPv6
    off and ``RULES`` loaded; its descriptor and a netlink socket in it."""
    fd, _ = netns.namespace_fd(())
    try:
        netns.join_namespace(f"/proc/self/fd/{fd}")
        for name, value in _SYSCTLS.items():
            Path("/proc/sys", name).write_text(value)
        _load_rules()
        return fd, Netlink()
    except BaseException:
        os.close(fd)
        raise


def _load_rules() -> None:
    """``nft -f -`` in this thread's namespace (a child inherits the thread's namespaces).

    Raises:
        OSError: nft failed (its message is quoted).
    """
    try:
        done = subprocess.run(
            ["nft", "-f", "-"], input=RULES.encode(), capture_output=True, timeout=NFT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise OSError(
            errno.ETIMEDOUT, f"nft did not load the rules in {NFT_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise OSError(
            errno.EINVAL,
            f"nft refused the egress router's rules: "
            f"{done.stderr.decode(errors='replace').strip()}",
        )


def _configure_group(group_ns_fd: int, link: GroupLink) -> None:
    """Inside the group's namespace (the calling thread joins it: ``netns.on_this_thread``
    moves it back after): its address and default route."""
    netns.join_namespace(f"/proc/self/fd/{group_ns_fd}")
    with contextlib.suppress(OSError):  # egress is IPv4 only: no link-local address, no DAD
        Path(f"/proc/sys/net/ipv6/conf/{GROUP_IFNAME}/disable_ipv6").write_text("1")
    group = Netlink()
    try:
        group.set_up(GROUP_INDEX)
        group.add_address(GROUP_INDEX, link.group_address, 31)
        group.add_default_route(link.router_address, GROUP_INDEX)
    finally:
        group.close()
