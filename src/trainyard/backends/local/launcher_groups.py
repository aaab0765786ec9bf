"""The groups' network namespaces a launcher holds (``GroupNetworks``): made on request (as
root a descriptor of the launcher's, else a forked holder child), given egress (a veth to the
launcher's egress router, else a pasta of their own), their forwarded ports relayed to the
host's, and dropped ``group_grace_s`` after their last runner ended.
Design: docs/local-backend.md, "Module: `src/trainyard/backends/local/launcher.py`".
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainyard.backends.local import netns
from trainyard.backends.local.launcher_process import Children, forget_in_child, say
from trainyard.backends.local.messages import NetworkReply, NetworkSpec
from trainyard.backends.local.router import EgressRouter, GroupLink, probe_router
from trainyard.errors import BackendError
from trainyard.linux import proctree

__all__ = ["GroupNamespace", "GroupNetworks", "UNJOINED_GRACE_S"]

UNJOINED_GRACE_S = 120.0
"""How long a group namespace asked for (``network``) waits for its first runner. The
backend asks for it, then prepares the attempt and starts its runner: on a loaded machine
(load ~12 on 2 cores) that took over ``group_grace_s`` (5 s), the group was dropped first
and the runner's ``nsenter --net=/proc/PID/fd/N`` found no descriptor (exit 126)."""

_EXPIRY_PERIOD_S = 0.1


@dataclass
class GroupNamespace:
    """A group's namespace and the runners of that group alive now.

    As root the namespace is an open descriptor of the launcher's (``ns_fd``) and its port
    listeners are the launcher's sockets; otherwise a forked child holds it (``ns_pid``,
    it needs a user namespace, which only a single-threaded process may make) and passes
    connections up ``channel``.
    """

    ns_pid: int
    ns_created: float
    user_ns: bool
    ns_fd: int | None = None
    channel: socket.socket | None = None
    listeners: list[socket.socket] = field(default_factory=list)
    runners: set[int | str] = field(default_factory=set)
    joined: bool = False  # a runner has joined it (before: the start is still on its way)
    idle_since: float = field(default_factory=time.monotonic)
    egress: subprocess.Popen[bytes] | None = None  # pasta, ended with the group
    link: GroupLink | None = None  # its veth to the egress router, instead of a pasta
    router: EgressRouter | None = None  # the router that ``link`` goes to
    egress_ready: threading.Event = field(default_factory=threading.Event)
    egress_error: str | None = None

    def reply(self) -> NetworkReply:
        """The ``network`` request's reply naming this namespace."""
        path = f"/proc/{os.getpid()}/fd/{self.ns_fd}" if self.ns_fd is not None else None
        return {
            "launcher_pid": os.getpid(),
            "ns_pid": self.ns_pid,
            "ns_created": self.ns_created,
            "user_ns": self.user_ns,
            "ns_path": path,
        }


class GroupNetworks:
    """The namespaces of the launcher's groups, by group key.

    Args:
        selector: the launcher's; listeners, holder channels and pastas' ready lines are
            registered there with data ``("listen", port)``, ``("channel", None)`` and
            ``("egress", key)``: the main loop hands them to ``relay`` and
            ``finish_egress``.
        children: the launcher's forked children (a holder child is one).
        created: the launcher's create time (a namespace held as a descriptor names it).
        group_grace_s: how long a namespace outlives its last runner, seconds.
    """

    def __init__(
        self,
        selector: selectors.BaseSelector,
        children: Children,
        created: float,
        group_grace_s: float,
    ) -> None:
        self.selector = selector
        self.children = children
        self.created = created
        self.group_grace_s = group_grace_s
        self.groups: dict[str, GroupNamespace] = {}
        self.router: EgressRouter | None = None
        self.router_why_not: str | None = None  # set once the router could not be had
        self._next_expiry = 0.0

    def network(self, spec: NetworkSpec, wait: bool = True) -> NetworkReply:
        """The group's namespace, made if none is alive; with ``egress``, pasta attached. With
        ``wait`` the reply comes once egress works; otherwise the group's ``egress_ready`` is
        set when it does (the main loop reads pasta's ready line), so a hosted runner's
        thread waits, not this loop (pasta takes ~70 ms of wall time to start).

        Raises:
            BackendError: the namespace could not be made, or (with ``wait``) its egress
                did not start.
        """
        key, ports, egress = spec.group, spec.forward, spec.egress
        group = self.groups.get(key)
        if (
            group is not None
            and group.ns_fd is None
            and proctree.same_process(group.ns_pid, group.ns_created) is None
        ):
            self.drop(key)
            group = None
        if group is None:
            group = self.groups[key] = self._make_namespace(ports)
            if not (egress and self._route(key, group)):
                self._start_egress(key, group, egress)
        if wait and not group.egress_ready.is_set():
            self.finish_egress(group, block=True)
        if wait and group.egress_error:
            error = group.egress_error
            self.drop(key)
            raise BackendError(error)
        group.idle_since = time.monotonic()
        return group.reply()

    def hosted_join(self, spec: NetworkSpec | None) -> Callable[[], None] | None:
        """The first step of a hosted runner in ``spec``'s namespace (made, not waited for,
        as by ``network``): join it, then wait until its egress works; None without ``spec``.

        Raises:
            ValueError: the namespace is not held as a descriptor (not root).
        """
        if spec is None:
            return None
        ns_path = self.network(spec, wait=False)["ns_path"]
        if ns_path is None:
            raise ValueError(
                "only a namespace held as a descriptor (as root) is joined by a hosted runner"
            )
        return functools.partial(_join_when_ready, ns_path, self.groups[spec.group])

    def joined(self, runner: int | str, group: str | None) -> None:
        """``runner`` (a pid, or a hosted runner's run folder) of ``group`` started."""
        if group is not None and group in self.groups:
            self.groups[group].runners.add(runner)
            self.groups[group].joined = True

    def left(self, runner: int | str, group: str | None) -> None:
        """``runner`` of ``group`` ended: the group's grace starts when it was the last."""
        if group is not None and group in self.groups:
            entry = self.groups[group]
            entry.runners.discard(runner)
            if not entry.runners:
                entry.idle_since = time.monotonic()

    def finish_egress(self, group: GroupNamespace | None, block: bool = False) -> None:
        """pasta's ready line (or its end) arrived: record it and wake the group's waiters.
        With ``block``, wait for it (at most ``netns.EGRESS_READY_TIMEOUT_S``)."""
        if group is None or group.egress is None or group.egress_ready.is_set():
            return
        stdout = group.egress.stdout
        with contextlib.suppress(KeyError, ValueError):
            if stdout is not None:
                self.selector.unregister(stdout)
        try:
            netns.wait_egress(group.egress, netns.EGRESS_READY_TIMEOUT_S if block else 0.0)
        except BackendError as exc:
            group.egress_error = str(exc)
        group.egress_ready.set()

    def relay(self, what: tuple[str, int | None], sock: socket.socket) -> None:
        """A connection to a forwarded port inside a namespace: bridge it to the host's."""
        if what[0] == "listen":
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.setblocking(True)
            fd, port = conn.detach(), int(what[1] or 0)
        else:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 1)
            except OSError:
                msg, fds = b"", []
            if not msg:  # the namespace child is gone
                self.selector.unregister(sock)
                return
            fd, port = fds[0], struct.unpack("!H", msg)[0]
        netns.bridge(fd, port)

    def expire(self) -> None:
        """Drop the namespaces with no runner for their grace (``group_grace_s``; one no
        runner joined yet: at least ``UNJOINED_GRACE_S``), at most every 0.1 s."""
        now = time.monotonic()
        if now < self._next_expiry:  # a pass looks at every group: not on every request
            return
        self._next_expiry = now + _EXPIRY_PERIOD_S
        for key, group in list(self.groups.items()):
            grace = (
                self.group_grace_s if group.joined else max(self.group_grace_s, UNJOINED_GRACE_S)
            )
            if not group.runners and now - group.idle_since > grace:
                self.drop(key)

    def drop(self, key: str) -> None:
        """Drop the group ``key``'s namespace: its sockets, its egress and its holder."""
        group = self.groups.pop(key)
        for sock in [*group.listeners, *([group.channel] if group.channel else [])]:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()  # a namespace child exits when its channel closes
        if group.egress is not None:
            if group.egress.stdout is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self.selector.unregister(group.egress.stdout)
            netns.stop_egress(group.egress)
        group.egress_ready.set()  # a runner still waiting gives up
        if group.link is not None and group.router is not None:
            group.router.detach(group.link)  # the veth goes with the namespace, closed next
        if group.ns_fd is not None:
            os.close(group.ns_fd)
        elif group.ns_pid != os.getpid():
            with contextlib.suppress(ProcessLookupError):
                os.kill(group.ns_pid, signal.SIGKILL)

    def close(self) -> None:
        """Drop every namespace, then the egress router."""
        for group in list(self.groups):
            self.drop(group)
        if self.router is not None:
            self.router.close()
            self.router = None

    def _route(self, key: str, group: GroupNamespace) -> bool:
        """Give a new group egress through the launcher's router (made at the first call).
        Returns False where there is no router (``_egress_router``) or attaching failed (said
        in the log): the caller gives the group a pasta of its own."""
        router = self._egress_router()  # says once in the log why there is none
        if router is None or group.ns_fd is None:
            return False
        try:
            group.link, group.router = router.attach(group.ns_fd), router
        except OSError as exc:
            say(
                f"launcher: group {key}: no veth to the egress router ({exc}); "
                "a pasta of its own instead"
            )
            return False
        group.egress_ready.set()
        return True

    def _egress_router(self) -> EgressRouter | None:
        """The launcher's egress router, made (on this, the main, thread: its pasta dies with
        it) when first needed and again if its pasta died; None, said once in the log, where
        it cannot be had."""
        if self.router is not None and not self.router.alive():
            say(
                f"launcher: the egress router's pasta exited ({self.router.pasta.returncode}); "
                "new groups get a new router"
            )
            self.router.close()
            self.router = None
        if self.router is None and self.router_why_not is None:
            why_not = probe_router()
            try:
                if why_not is None:
                    self.router = EgressRouter.make()
                    say(f"launcher: egress router ready (one pasta, pid {self.router.pasta.pid})")
            except BackendError as exc:
                why_not = str(exc)
            if why_not is not None:
                self.router_why_not = why_not
                say(f"launcher: no egress router ({why_not}); each group gets a pasta of its own")
        return self.router

    def _start_egress(self, key: str, group: GroupNamespace, egress: bool) -> None:
        if not egress:
            group.egress_ready.set()
            return
        try:
            group.egress = netns.start_egress(
                ns_fd=group.ns_fd,
                ns_pid=None if group.ns_fd is not None else group.ns_pid,
                wait=False,
            )
        except BackendError:
            self.drop(key)
            raise
        assert group.egress.stdout is not None
        self.selector.register(group.egress.stdout, selectors.EVENT_READ, ("egress", key))

    def _make_namespace(self, ports: list[int]) -> GroupNamespace:
        if os.geteuid() == 0:
            fd, listeners = netns.namespace_fd(ports)
            group = GroupNamespace(os.getpid(), self.created, False, ns_fd=fd, listeners=listeners)
            for sock, port in zip(listeners, ports, strict=True):
                sock.setblocking(False)
                self.selector.register(sock, selectors.EVENT_READ, ("listen", port))
            return group
        return self._fork_namespace(ports)

    def _fork_namespace(self, ports: list[int]) -> GroupNamespace:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the namespace child (never returns)
            try:
                forget_in_child(keep={theirs.fileno(), ready_w})
                netns.hold_namespace(theirs, ready_w, ports)
            finally:
                os._exit(1)
        self.children.pids.add(pid)
        theirs.close()
        os.close(ready_w)
        ready = os.read(ready_r, 1)
        os.close(ready_r)
        if not ready:
            mine.close()
            self.children.pids.discard(pid)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            raise BackendError("could not make a network namespace (see the launcher log)")
        created = proctree.create_time(pid) or time.time()
        group = GroupNamespace(pid, created, ready == b"U", channel=mine)
        self.selector.register(mine, selectors.EVENT_READ, ("channel", None))
        return group


def _join_when_ready(ns_path: str, group: GroupNamespace) -> None:
    """A hosted runner's first step: join the group's namespace, then wait until its egress
    works (or is known to have failed, which ends the attempt)."""
    netns.join_namespace(ns_path)
    if not group.egress_ready.wait(netns.EGRESS_READY_TIMEOUT_S + 5.0):
        raise BackendError("the group's egress (pasta) did not get ready")
    if group.egress_error:
        raise BackendError(group.egress_error)
