"""The few rtnetlink requests the egress router needs, on a raw ``AF_NETLINK`` socket.

Why raw and not pyroute2: a netlink socket belongs to the network namespace of the thread
that opened it, which is exactly what the router needs (one socket per namespace, opened on
the thread that made it). pyroute2 0.9 opens its sockets through its own event loop (a
socket made on a thread that had joined another namespace still listed the host's links)
and cost ~4.9 ms of CPU per group for the same four requests that take ~0.3 ms here
(docs/benchmarks-history.md, "Egress"). The messages are the kernel's (``rtnetlink(7)``,
``include/uapi/linux/{netlink,rtnetlink,if_link,veth}.h``); every request asks for an ACK
and a refusal raises ``OSError`` with the kernel's errno.
"""

from __future__ import annotations

import ipaddress
import itertools
import os
import socket
import struct

__all__ = ["Netlink", "IFF_UP"]

_NETLINK_ROUTE = 0
_RTM_NEWLINK, _RTM_DELLINK, _RTM_NEWADDR, _RTM_NEWROUTE = 16, 17, 20, 24
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_NLMSG_ERROR = 2
_IFLA_IFNAME, _IFLA_MTU, _IFLA_LINKINFO, _IFLA_NET_NS_FD = 3, 4, 18, 28
_IFLA_INFO_KIND, _IFLA_INFO_DATA, _VETH_INFO_PEER = 1, 2, 1
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_RTA_OIF, _RTA_GATEWAY = 4, 5
_RT_TABLE_MAIN, _RTPROT_BOOT, _RT_SCOPE_UNIVERSE, _RTN_UNICAST = 254, 3, 0, 1
IFF_UP = 0x1
REPLY_TIMEOUT_S = 5.0
_NLMSGHDR = struct.Struct("=IHHII")
_IFINFOMSG = struct.Struct("=BxHiII")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTMSG = struct.Struct("=BBBBBBBBI")
_RTATTR = struct.Struct("=HH")


def _attr(kind: int, payload: bytes) -> bytes:
    length = _RTATTR.size + len(payload)
    return _RTATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _name(text: str) -> bytes:
    return text.encode() + b"\0"


def _ifinfo(index: int = 0, up: bool = False) -> bytes:
    flags = IFF_UP if up else 0
    return _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, flags, IFF_UP if up else 0)


class Netlink:
    """A ``NETLINK_ROUTE`` socket of the calling thread's network namespace (it stays there
    whatever the thread does later). Not thread-safe: one request at a time. Each request
    waits for the kernel's ACK (at most ``REPLY_TIMEOUT_S``).

    Raises:
        OSError: the socket cannot be made; a request was refused (the kernel's errno) or got
            no answer in time (``TimeoutError``).
    """

    def __init__(self) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_ROUTE
        )
        self.sock.bind((0, 0))
        self.sock.settimeout(REPLY_TIMEOUT_S)  # the kernel always answers; never hang on it
        self._seq = itertools.count(1)

    def close(self) -> None:
        """Close the socket. Idempotent."""
        self.sock.close()

    def add_veth(
        self, name: str, index: int, peer_name: str, peer_index: int, peer_ns_fd: int, mtu: int
    ) -> None:
        """A veth pair: ``name`` (ifindex ``index``, up) in this socket's namespace,
        ``peer_name`` (``peer_index``, down: a veth end cannot come up before its peer is
        linked to it, ``veth_open`` says ENOTCONN; ``set_up`` it from its namespace) in the
        namespace of descriptor ``peer_ns_fd``.

        Raises:
            OSError: e.g. EEXIST or EBUSY when the name or an index is taken.
        """
        peer = (
            _ifinfo(peer_index)
            + _attr(_IFLA_IFNAME, _name(peer_name))
            + _attr(_IFLA_NET_NS_FD, struct.pack("=I", peer_ns_fd))
            + _attr(_IFLA_MTU, struct.pack("=I", mtu))
        )
        info = _attr(_IFLA_INFO_KIND, b"veth") + _attr(
            _IFLA_INFO_DATA, _attr(_VETH_INFO_PEER, peer)
        )
        body = (
            _ifinfo(index, up=True)
            + _attr(_IFLA_IFNAME, _name(name))
            + _attr(_IFLA_MTU, struct.pack("=I", mtu))
            + _attr(_IFLA_LINKINFO, info)
        )
        self._request(_RTM_NEWLINK, _NLM_F_CREATE | _NLM_F_EXCL, body)

    def set_up(self, index: int) -> None:
        """Bring interface ``index`` up."""
        self._request(_RTM_NEWLINK, 0, _ifinfo(index, up=True))

    def delete_link(self, index: int) -> None:
        """Delete the interface ``index`` (a veth takes its peer with it).

        Raises:
            OSError: ENODEV when there is none.
        """
        self._request(_RTM_DELLINK, 0, _ifinfo(index))

    def add_address(self, index: int, address: str, prefix_len: int) -> None:
        """``address/prefix_len`` on interface ``index`` (the connected route comes with it)."""
        packed = ipaddress.IPv4Address(address).packed
        body = (
            _IFADDRMSG.pack(socket.AF_INET, prefix_len, 0, _RT_SCOPE_UNIVERSE, index)
            + _attr(_IFA_LOCAL, packed)
            + _attr(_IFA_ADDRESS, packed)
        )
        self._request(_RTM_NEWADDR, _NLM_F_CREATE | _NLM_F_EXCL, body)

    def add_default_route(self, gateway: str, index: int) -> None:
        """The IPv4 default route via ``gateway`` out of interface ``index``."""
        body = (
            _RTMSG.pack(
                socket.AF_INET,
                0,
                0,
                0,
                _RT_TABLE_MAIN,
                _RTPROT_BOOT,
                _RT_SCOPE_UNIVERSE,
                _RTN_UNICAST,
                0,
            )
            + _attr(_RTA_GATEWAY, ipaddress.IPv4Address(gateway).packed)
            + _attr(_RTA_OIF, struct.pack("=i", index))
        )
        self._request(_RTM_NEWROUTE, _NLM_F_CREATE | _NLM_F_EXCL, body)

    def _request(self, kind: int, flags: int, body: bytes) -> None:
        seq = next(self._seq)
        header = _NLMSGHDR.pack(
            _NLMSGHDR.size + len(body), kind, _NLM_F_REQUEST | _NLM_F_ACK | flags, seq, 0
        )
        self.sock.send(header + body)
        while True:
            reply = self.sock.recv(65536)
            offset = 0
            while offset + _NLMSGHDR.size <= len(reply):
                length, rkind, _flags, rseq, _pid = _NLMSGHDR.unpack_from(reply, offset)
                if rkind == _NLMSG_ERROR and rseq == seq:
                    code = -struct.unpack_from("=i", reply, offset + _NLMSGHDR.size)[0]
                    if code:
                        raise OSError(code, f"rtnetlink: {os.strerror(code)}")
                    return
                offset += max(length + (-length % 4), _NLMSGHDR.size)
