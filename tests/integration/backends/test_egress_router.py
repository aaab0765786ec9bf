"""Issue 11, egress router (``backends.local.router``): real namespaces, a real pasta, real
nftables rules. Each group namespace gets a veth to the router; the router forwards to pasta
and nothing else. The tests run commands inside the namespaces with ``nsenter``.

"Outside" is an HTTP server on this machine's non-loopback address (no internet here).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from test_local_egress import outside_address, serve

from trainyard.backends.local import netns
from trainyard.backends.local.router import (
    GROUP_IFNAME_PREFIX,
    GROUP_NETWORK,
    EgressRouter,
    GroupLink,
    probe_router,
)

pytestmark = pytest.mark.skipif(
    probe_router() is not None, reason=f"no egress router here: {probe_router()}"
)

CONNECT = """import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
source = sys.argv[3] if len(sys.argv) > 3 else None
try:
    with socket.socket() as s:
        s.settimeout(3)
        if source:
            s.bind((source, 0))
        s.connect((host, port))
        print("CONNECTED", end=" ", flush=True)
        try:
            print(s.recv(100).decode())
        except OSError:
            print()
except OSError as exc:
    print("FAILED", type(exc).__name__, exc.errno)
"""


def inside(ns_fd: int, *argv: str, timeout_s: float = 20.0) -> str:
    """Run ``argv`` in the namespace of descriptor ``ns_fd``; its stdout."""
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{os.getpid()}/fd/{ns_fd}", "--", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def connect(ns_fd: int, host: str, port: int, source: str | None = None) -> str:
    args = [host, str(port)] + ([source] if source else [])
    return inside(ns_fd, sys.executable, "-c", CONNECT, *args).strip()


@pytest.fixture
def router() -> Iterator[EgressRouter]:
    made = EgressRouter.make()
    yield made
    made.close()


@pytest.fixture
def groups(router: EgressRouter) -> Iterator[list[tuple[int, GroupLink]]]:
    """Two group namespaces attached to the router: (descriptor, link) each."""
    made = []
    for _ in range(2):
        fd, _ = netns.namespace_fd(())
        made.append((fd, router.attach(fd)))
    yield made
    for fd, link in made:
        router.detach(link)
        os.close(fd)


class _Listener:
    """A TCP server in a group namespace on 0.0.0.0:port that answers ``secret``."""

    def __init__(self, ns_fd: int, secret: str) -> None:
        code = (
            "import socket, sys\nsrv = socket.create_server(('0.0.0.0', 0))\n"
            "print(srv.getsockname()[1], flush=True)\nsrv.settimeout(30)\n"
            "while True:\n    c, _ = srv.accept(); c.sendall(sys.argv[1].encode()); c.close()\n"
        )
        self.proc = subprocess.Popen(
            [
                "nsenter",
                f"--net=/proc/{os.getpid()}/fd/{ns_fd}",
                "--",
                sys.executable,
                "-c",
                code,
                secret,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_a_group_gets_its_own_address_and_reaches_outside(
    groups: list[tuple[int, GroupLink]],
) -> None:
    (fd_a, a), (fd_b, b) = groups
    assert a.group_address != b.group_address
    assert all(
        ipaddress.IPv4Address(x) in GROUP_NETWORK for x in (a.group_address, b.group_address)
    )
    assert f"inet {a.group_address}/31" in inside(fd_a, "ip", "-4", "-o", "addr", "show", "eth0")
    server, url = serve(outside_address())
    try:
        code = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=5).read().decode())"
        secret = server.RequestHandlerClass.secret  # type: ignore[attr-defined]
        assert inside(fd_b, sys.executable, "-c", code).strip() == secret
    finally:
        server.shutdown()
        server.server_close()


def test_one_group_cannot_reach_another_over_the_router(
    router: EgressRouter, groups: list[tuple[int, GroupLink]]
) -> None:
    """B connects to A's address: rejected by the forward rule. With the rules flushed (the
    same router, same routes), B reaches A: the rule, not the layout, is what holds."""
    (fd_a, a), (fd_b, _b) = groups
    listener = _Listener(fd_a, "group-a-secret")
    try:
        assert connect(fd_a, a.group_address, listener.port) == "CONNECTED group-a-secret"
        refused = connect(fd_b, a.group_address, listener.port)
        assert refused.startswith("FAILED") and "group-a-secret" not in refused
        inside(router.ns_fd, "nft", "flush", "ruleset")
        assert connect(fd_b, a.group_address, listener.port) == "CONNECTED group-a-secret"
    finally:
        listener.close()


def test_a_group_cannot_reach_the_router_itself(groups: list[tuple[int, GroupLink]]) -> None:
    """Its gateway, another group's router end and pasta's address in the router: each
    rejected (no service of the router's is reachable, an sshd say)."""
    (fd_a, a), (_fd_b, b) = groups
    listener = _Listener(fd_a, "unused")  # a real port: only the rules stand in the way
    try:
        for target in (a.router_address, b.router_address, netns.EGRESS_ADDRESS):
            result = connect(fd_a, target, listener.port)
            assert result.startswith("FAILED"), (target, result)
    finally:
        listener.close()


UDP_WAIT = """import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.settimeout(float(sys.argv[2]))
print("READY", flush=True)
try:
    print("GOT", s.recvfrom(100)[0].decode())
except OSError:
    print("NOTHING")
"""
UDP_SEND = """import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
s.settimeout(3)
s.sendto(b"reflected", (sys.argv[3], int(sys.argv[4])))
try:
    print("ECHO", s.recvfrom(100)[0].decode())
except OSError:
    print("NO ECHO")
"""


def _udp_echo(address: str) -> tuple[socket.socket, int]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((address, 0))

    def echo() -> None:
        with contextlib.suppress(OSError):
            while True:
                data, peer = sock.recvfrom(100)
                sock.sendto(data, peer)

    threading.Thread(target=echo, daemon=True).start()
    return sock, sock.getsockname()[1]


def test_a_group_cannot_pose_as_another(groups: list[tuple[int, GroupLink]]) -> None:
    """The namespace's root (not a task: tasks have no capabilities) adds B's address to A's
    eth0 and sends a datagram from it to a UDP echo outside, so that the echo lands on B's
    socket: the router's reverse-path rule drops it. From A's own address the echo comes."""
    (fd_a, a), (fd_b, b) = groups
    echo, echo_port = _udp_echo(outside_address())
    port = 20000 + os.getpid() % 20000
    waiter = subprocess.Popen(
        [
            "nsenter",
            f"--net=/proc/{os.getpid()}/fd/{fd_b}",
            "--",
            sys.executable,
            "-c",
            UDP_WAIT,
            str(port),
            "15",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "READY"
        assert (
            inside(
                fd_a,
                sys.executable,
                "-c",
                UDP_SEND,
                a.group_address,
                str(port),
                outside_address(),
                str(echo_port),
            ).strip()
            == "ECHO reflected"
        )
        inside(fd_a, "ip", "addr", "add", f"{b.group_address}/32", "dev", "eth0")
        inside(
            fd_a,
            sys.executable,
            "-c",
            UDP_SEND,
            b.group_address,
            str(port),
            outside_address(),
            str(echo_port),
        )
        assert waiter.poll() is None, "B stopped waiting before A's try: the test proves nothing"
        out, _ = waiter.communicate(timeout=30)
        assert out.strip() == "NOTHING"
    finally:
        waiter.kill()
        waiter.wait()
        echo.close()


def _router_links(router: EgressRouter) -> list[str]:
    out = inside(router.ns_fd, "ip", "-o", "link", "show")
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines()]


def test_a_groups_veth_goes_with_its_namespace(router: EgressRouter) -> None:
    fd, _ = netns.namespace_fd(())
    link = router.attach(fd)
    name = f"{GROUP_IFNAME_PREFIX}{link.slot}"
    assert name in _router_links(router)
    router.detach(link)
    os.close(fd)  # the namespace goes; the kernel removes both ends of the veth
    deadline = time.monotonic() + 30
    while name in _router_links(router) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [n for n in _router_links(router) if n.startswith(GROUP_IFNAME_PREFIX)]


def test_slots_go_round_and_skip_links_still_there(router: EgressRouter) -> None:
    """A slot whose link still exists (its namespace is alive) is never handed out again."""
    fd1, _ = netns.namespace_fd(())
    first = router.attach(fd1)
    router.detach(first)  # forgotten, but fd1 keeps the namespace and its veth alive
    router._next_slot = first.slot  # the ring comes round to it
    fd2, _ = netns.namespace_fd(())
    try:
        second = router.attach(fd2)
        assert second.slot != first.slot
        router.detach(second)
    finally:
        os.close(fd1)
        os.close(fd2)


def test_close_ends_pasta_and_the_router(router: EgressRouter) -> None:
    pasta = router.pasta
    assert router.alive()
    router.close()
    assert pasta.poll() is not None
    with pytest.raises(OSError):
        os.fstat(router.ns_fd)
    router.close()  # idempotent
