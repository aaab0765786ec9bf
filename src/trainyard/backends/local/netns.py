"""Per-group network namespaces for the local backend.

Every group gets its own network namespace with only ``lo``, so a gang's tasks reach each
other on 127/8 and two workflows can bind the same port. A *keeper*
(``python -m trainyard.backends.local.netns GROUP_DIR``) forks a child that unshares the
namespace (with a user namespace when not root) and holds it; tasks join it with ``nsenter``.
``GROUP_DIR/netns.json`` ({"keeper_pid", "ns_pid", "ns_created", "user_ns"}) appears once it
is ready. ``--forward PORT`` brings the host's 127.0.0.1:PORT into the namespace; egress goes
through pasta (``start_egress``, ``pasta_argv``). The keeper exits once the namespace has been
empty for ``--idle-s`` seconds and ``GROUP_DIR/lease`` is at least that old.
Why, pasta's flags and DNS: docs/local-backend.md, "Group network namespaces".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from trainyard.errors import BackendError
from trainyard.linux import proctree
from trainyard.linux.libc import libc as c_library

__all__ = [
    "GroupNetwork",
    "ensure_group_network",
    "probe_netns",
    "namespace_fd",
    "on_own_thread",
    "on_this_thread",
    "join_namespace",
    "hold_namespace",
    "bridge",
    "main",
    "pasta_argv",
    "start_egress",
    "wait_egress",
    "stop_egress",
    "probe_egress",
    "probe_egress_attach",
    "EGRESS_ADDRESS",
    "EGRESS_GATEWAY",
]

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"
INFO = "netns.json"
EGRESS_ADDRESS = "10.0.2.100"
"""The address of a group namespace's ``eth0`` when it has egress (slirp4netns' default)."""
EGRESS_GATEWAY = "10.0.2.2"
EGRESS_PREFIX_LEN = 24
EGRESS_READY_TIMEOUT_S = 10.0
LEASE = "lease"


@dataclass(frozen=True)
class GroupNetwork:
    """A live group namespace: ``ns_pid`` holds it (created at ``ns_created``), either as a
    process inside it or, with ``ns_path``, as an open descriptor of it (``/proc/PID/fd/N``)."""

    keeper_pid: int
    ns_pid: int
    ns_created: float
    user_ns: bool
    ns_path: str | None = None

    def join_argv(self) -> list[str]:
        """The command prefix that runs a program inside the namespace."""
        if self.ns_path is not None and not self.user_ns:
            return ["nsenter", f"--net={self.ns_path}", "--"]
        argv = ["nsenter", f"--target={self.ns_pid}", "--net"]
        if self.user_ns:
            argv += ["--user", "--preserve-credentials"]
        return [*argv, "--"]

    def alive(self) -> bool:
        """Whether the process holding the namespace is still the recorded one."""
        return proctree.same_process(self.ns_pid, self.ns_created) is not None


# ---------------------------------------------------------------------- backend side


def _read_info(group_dir: Path) -> GroupNetwork | None:
    try:
        data = json.loads((group_dir / INFO).read_text())
        return GroupNetwork(
            int(data["keeper_pid"]),
            int(data["ns_pid"]),
            float(data["ns_created"]),
            bool(data["user_ns"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _start_keeper(
    group_dir: Path, forward_ports: Sequence[int], python: str, idle_s: float
) -> subprocess.Popen[bytes]:
    argv = [python, "-m", "trainyard.backends.local.netns", str(group_dir), "--idle-s", str(idle_s)]
    for port in forward_ports:
        argv += ["--forward", str(port)]
    with open(group_dir / "keeper.log", "ab") as log:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )


def ensure_group_network(
    group_dir: Path,
    forward_ports: Sequence[int] = (),
    *,
    python: str = sys.executable,
    idle_s: float = 20.0,
    timeout_s: float = 15.0,
) -> GroupNetwork:
    """The group's namespace, started first if none is alive. Touches the lease.

    Raises:
        BackendError: the keeper could not make a namespace (its log is quoted).
    """
    group_dir.mkdir(parents=True, exist_ok=True)
    (group_dir / LEASE).touch()
    current = _read_info(group_dir)
    if current is not None and current.alive():
        return current
    (group_dir / INFO).unlink(missing_ok=True)
    keeper = _start_keeper(group_dir, forward_ports, python, idle_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = _read_info(group_dir)
        if info is not None and info.keeper_pid == keeper.pid:
            return info
        if keeper.poll() is not None:
            break
        time.sleep(0.02)
    keeper.kill()
    keeper.wait()
    tail = (group_dir / "keeper.log").read_text(errors="replace")[-500:]
    raise BackendError(f"could not create a network namespace in {group_dir}: {tail.strip()}")


def probe_netns(python: str = sys.executable) -> str | None:
    """Try a namespace and ``nsenter`` into it. Returns None if it works, else why not."""
    with tempfile.TemporaryDirectory(prefix="trainyard-netns-probe-") as tmp:
        try:
            net = ensure_group_network(Path(tmp), python=python, idle_s=0.5, timeout_s=10)
        except (BackendError, OSError) as exc:
            return str(exc)
        try:
            done = subprocess.run([*net.join_argv(), "true"], capture_output=True, timeout=10)
            return None if done.returncode == 0 else done.stderr.decode(errors="replace").strip()
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        finally:
            _kill_quietly(net.keeper_pid, net.ns_pid)


def _kill_quietly(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------------- namespace child


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _unshare_network() -> bool:
    """Move this (single-threaded) process into a new network namespace.
    Returns True when a user namespace had to be made too."""
    libc = c_library()
    if os.geteuid() == 0 and libc.unshare(_CLONE_NEWNET) == 0:
        return False
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET), "unshare(CLONE_NEWUSER|CLONE_NEWNET)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
    Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
    return True


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack(
            _IFREQ, fcntl.ioctl(sock, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        )[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def namespace_fd(ports: Sequence[int]) -> tuple[int, list[socket.socket]]:
    """As root: a new network namespace with ``lo`` up, held by an open descriptor (no process
    in it), and a listening socket inside it on 127.0.0.1:PORT for each of ``ports``.

    The namespace is made by the calling thread, which then goes back to its own
    (``on_this_thread``: a network namespace is per thread in Linux, ``unshare(2)``), so the
    calling process stays where it is. The descriptor keeps the
    namespace alive until it is closed and no process is in it; ``nsenter --net=/proc/PID/fd/N``
    joins it.

    Returns:
        (descriptor, listeners).

    Raises:
        OSError: not permitted (not root) or the kernel refused.
    """

    def work() -> tuple[int, list[socket.socket]]:
        libc = c_library()
        _check(libc.unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        _loopback_up()
        fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        return fd, [_listen(port) for port in ports]

    return on_this_thread(work)


def on_own_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` run on a new thread that ends with it, so that namespaces it joins or makes
    (per thread in Linux: ``unshare(2)``, ``setns(2)``) never touch the calling thread.

    Returns:
        what ``work`` returned. Raises: the OSError it raised.
    """
    made: dict[str, object] = {}

    def run() -> None:
        try:
            made["done"] = work()
        except OSError as exc:
            made["error"] = exc

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join()
    if "error" in made:
        raise made["error"]  # type: ignore[misc]
    return made["done"]  # type: ignore[return-value]


def on_this_thread(work: Callable[[], T]) -> T:
    """``work()`` run on the calling thread, which is then moved back into the network
    namespace it was in (``setns(2)``), whatever namespace ``work`` made or joined. For a
    busy threaded process (the launcher, whose hosted runners are threads) this is
    ``on_own_thread`` without a thread's start and join, each of which waits for the GIL
    (up to a switch interval, 5 ms, while other threads run Python): per group start, on the
    launcher's one serial loop. Needs CAP_SYS_ADMIN (root), as making
    or joining a namespace does.

    Returns:
        what ``work`` returned. Raises: what it raised.

    A thread that could not go back would go on in a task's namespace: the process is ended
    (exit 70, said on stderr) instead; ``setns`` back into a namespace the thread was in, by
    an open descriptor, as root, does not fail in practice.
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return work()
    finally:
        libc = c_library()
        if libc.setns(home, _CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            sys.stderr.write(
                f"trainyard: cannot move thread back to its network namespace "
                f"({os.strerror(code)}); exiting\n"
            )
            sys.stderr.flush()
            os._exit(70)
        os.close(home)


def join_namespace(path: str) -> None:
    """Move the calling thread (only it: network namespaces are per thread in Linux,
    ``setns(2)``) into the network namespace of ``path``; what it starts inherits it. For a
    thread that never needs the host's network again (a hosted runner's, which moves no data).

    Raises:
        OSError: the file cannot be opened or the kernel refuses (needs CAP_SYS_ADMIN).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = c_library()
        _check(libc.setns(fd, _CLONE_NEWNET), f"setns({path}, CLONE_NEWNET)")
    finally:
        os.close(fd)


def hold_namespace(channel: socket.socket, ready_fd: int, ports: Sequence[int]) -> None:
    """Runs in a forked, single-threaded child: make the namespace, write ``U`` (a user
    namespace was needed) or ``R`` to ``ready_fd``, then hold it and pass each connection
    accepted on a forwarded port up ``channel``; exits when ``channel`` closes. Never returns."""
    try:
        user_ns = _unshare_network()
        _loopback_up()
        listeners = {_listen(port): port for port in ports}
        os.write(ready_fd, b"U" if user_ns else b"R")
    except Exception as exc:  # tell the keeper, which reports it
        sys.stderr.write(f"netns child: {exc}\n")
        os._exit(1)
    os.close(ready_fd)
    while True:
        readable, _, _ = select.select([channel, *listeners], [], [])
        if channel in readable:  # the keeper is gone
            os._exit(0)
        for sock in readable:
            conn, _addr = sock.accept()
            socket.send_fds(channel, [struct.pack("!H", listeners[sock])], [conn.fileno()])
            conn.close()


# ---------------------------------------------------------------------- egress (pasta)


def probe_egress(pasta: str = "pasta") -> str | None:
    """None when ``pasta`` (and ``setpriv``, which ties its life to its parent's) is
    installed, else why egress cannot be given."""
    for tool, package in ((pasta, "passt"), ("setpriv", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {package})"
    return None


def pasta_argv(
    target: str,
    *,
    as_root: bool,
    userns: str | None = None,
    pasta: str = "pasta",
    ifname: str | None = None,
) -> list[str]:
    """The command that attaches pasta to a namespace (see module docstring, "Egress").

    Args:
        target: the network namespace file (``/proc/self/fd/N`` of a descriptor pasta
            inherits: after its self-isolation pasta may no longer open another process's
            ``/proc`` entries).
        as_root: pasta keeps root (``--runas 0``): as root it would switch to ``nobody``,
            which may not join a namespace that root holds. It drops its capabilities and
            isolates itself (seccomp, an empty mount namespace) all the same.
        userns: the user namespace that owns the network namespace (not as root), as
            ``target``.
        ifname: the name of pasta's interface in the namespace (``-I``; default the host's
            interface's name; the egress router names it, ``backends.local.router``).

    Returns:
        argv; pasta writes its pid on its stdout once the namespace is configured.
    """
    argv = ["setpriv", "--pdeathsig", "KILL", "--", pasta, "-f", "-q"]
    if as_root:
        argv += ["--runas", "0"]
    argv += [
        "-4",
        "--config-net",
        "-t",
        "none",
        "-u",
        "none",
        "-T",
        "none",
        "-U",
        "none",
        "--no-map-gw",
        "-a",
        EGRESS_ADDRESS,
        "-n",
        str(EGRESS_PREFIX_LEN),
        "-g",
        EGRESS_GATEWAY,
        "-P",
        "/dev/stdout",
    ]
    if ifname is not None:
        argv += ["-I", ifname]
    if userns is not None:
        argv += ["--userns", userns]
    return [*argv, "--netns", target]


def start_egress(
    *,
    ns_fd: int | None = None,
    ns_pid: int | None = None,
    timeout_s: float = EGRESS_READY_TIMEOUT_S,
    wait: bool = True,
    ifname: str | None = None,
) -> subprocess.Popen[bytes]:
    """Attach pasta to the namespace held by descriptor ``ns_fd`` (as root) or by process
    ``ns_pid`` (its user and network namespaces); with ``wait``, return once it has
    configured it (else the caller calls ``wait_egress``, or reads pasta's stdout: one line
    once ready, EOF if it failed). The caller ends it (``stop_egress``) when the namespace
    ends; it also dies with the calling thread's process.

    Raises:
        BackendError: pasta is missing, exited, or did not get ready in ``timeout_s``
            (its stderr is quoted).
    """
    why_not = probe_egress()
    if why_not is not None:
        raise BackendError(f"no egress for the group's network namespace: {why_not}")
    opened: list[int] = []
    try:
        if ns_fd is None:
            opened = [
                os.open(f"/proc/{ns_pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
                for kind in ("net", "user")
            ]
        fds = (ns_fd,) if ns_fd is not None else tuple(opened)
        argv = pasta_argv(
            f"/proc/self/fd/{fds[0]}",
            as_root=os.geteuid() == 0,
            userns=f"/proc/self/fd/{fds[1]}" if len(fds) > 1 else None,
            ifname=ifname,
        )
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            close_fds=True,
            pass_fds=fds,
        )
    except OSError as exc:
        raise BackendError(f"could not start pasta: {exc}") from exc
    finally:
        for fd in opened:
            os.close(fd)
    if wait:
        wait_egress(proc, timeout_s)
    return proc


def probe_egress_attach() -> str | None:
    """Attach pasta to a throw-away namespace of this process's making, as the launcher
    does (as root: a descriptor-held namespace). Returns None if that works, else why not
    (pasta missing, ``/dev/net/tun`` not usable, ...)."""
    why_not = probe_egress()
    if why_not is not None:
        return why_not
    if os.geteuid() != 0:
        return None  # a user namespace needs a single-threaded maker: the launcher's child
    try:
        fd, _ = namespace_fd(())
    except OSError as exc:
        return str(exc)
    try:
        stop_egress(start_egress(ns_fd=fd))
        return None
    except BackendError as exc:
        return str(exc)
    finally:
        os.close(fd)


def wait_egress(proc: subprocess.Popen[bytes], timeout_s: float = EGRESS_READY_TIMEOUT_S) -> None:
    """Wait until the pasta of ``start_egress`` has configured its namespace.

    Raises:
        BackendError: it exited or was not ready in ``timeout_s`` (it is then ended).
    """
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if ready and proc.stdout.readline().strip():
        proc.stdout.close()
        return
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    why = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
    stop_egress(proc)
    raise BackendError(
        f"pasta could not give the group's namespace egress: "
        f"{why or f'not ready in {timeout_s:.0f} s'}"
    )


def stop_egress(proc: subprocess.Popen[bytes]) -> None:
    """End a pasta started by ``start_egress`` and reap it. Idempotent."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# ---------------------------------------------------------------------- keeper (host side)


RELAY_CONNECT_TIMEOUT_S = 10.0
RELAY_CHUNK_BYTES = 65536


class _Relay:
    """Every bridged connection of this process on one event loop, in one thread: a task's
    connections to a forwarded port cost no thread each (1,500 idle ones cost 4,500 threads
    of the launcher when each had a thread per direction). The loop is made again in a
    forked child (the thread does not survive ``fork``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="port-relay", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def submit(self, fd: int, port: int) -> None:
        asyncio.run_coroutine_threadsafe(_bridge(fd, port), self.loop())


_RELAY = _Relay()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(RELAY_CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        pass


async def _bridge(fd: int, port: int) -> None:
    inner = socket.socket(fileno=fd)
    inner.setblocking(False)
    try:
        in_reader, in_writer = await asyncio.open_connection(sock=inner)
    except OSError:
        inner.close()
        return
    try:
        out_reader, out_writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), RELAY_CONNECT_TIMEOUT_S
        )
    except (TimeoutError, OSError):
        in_writer.close()
        return
    try:
        await asyncio.gather(_pipe(in_reader, out_writer), _pipe(out_reader, in_writer))
    finally:
        for writer in (in_writer, out_writer):
            writer.close()


def bridge(fd: int, port: int) -> None:
    """Copy bytes both ways between the accepted socket ``fd`` and 127.0.0.1:``port`` here,
    on this process's relay loop (``_Relay``); returns at once. ``fd`` is taken over."""
    _RELAY.submit(fd, port)


def _members(ns_pid: int) -> int:
    """How many processes other than ``ns_pid`` are in ``ns_pid``'s network namespace."""
    try:
        target = os.readlink(f"/proc/{ns_pid}/ns/net")
    except OSError:
        return 0
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != ns_pid:
            try:
                count += os.readlink(f"/proc/{name}/ns/net") == target
            except OSError:
                continue
    return count


def _idle_for(group_dir: Path, last_busy: float) -> float:
    try:
        lease = (group_dir / LEASE).stat().st_mtime
    except OSError:
        lease = 0.0
    return time.time() - max(last_busy, lease)


def _serve(channel: socket.socket, ns_pid: int, group_dir: Path, idle_s: float) -> None:
    last_busy = time.time()
    while True:
        readable, _, _ = select.select([channel], [], [], min(2.0, idle_s))
        if readable:
            msg, fds, _flags, _addr = socket.recv_fds(channel, 16, 1)
            if not msg:
                return
            bridge(fds[0], struct.unpack("!H", msg)[0])
        if _members(ns_pid):
            last_busy = time.time()
        elif _idle_for(group_dir, last_busy) > idle_s:
            return


def _write_info(group_dir: Path, ns_pid: int, user_ns: bool) -> None:
    data = {
        "keeper_pid": os.getpid(),
        "ns_pid": ns_pid,
        "ns_created": proctree.create_time(ns_pid),
        "user_ns": user_ns,
    }
    partial = group_dir / f".{INFO}.{os.getpid()}"
    partial.write_text(json.dumps(data))
    partial.replace(group_dir / INFO)


def run_keeper(group_dir: Path, ports: Sequence[int], idle_s: float) -> int:
    """The keeper's main: fork the namespace child, publish it, serve until idle."""
    keeper_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:
        keeper_end.close()
        os.close(ready_r)
        hold_namespace(child_end, ready_w, ports)
    child_end.close()
    os.close(ready_w)
    ready = os.read(ready_r, 1)
    if not ready:
        os.waitpid(child, 0)
        return 1
    _write_info(group_dir, child, ready == b"U")
    try:
        _serve(keeper_end, child, group_dir, idle_s)
    finally:
        _release(group_dir, child)
    return 0


def _release(group_dir: Path, child: int) -> None:
    info = _read_info(group_dir)
    if info is not None and info.keeper_pid == os.getpid():
        (group_dir / INFO).unlink(missing_ok=True)
    _kill_quietly(child)
    try:
        os.waitpid(child, 0)
    except ChildProcessError:
        pass


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.backends.local.netns GROUP_DIR [--forward PORT]... [--idle-s S]``."""
    parser = argparse.ArgumentParser(prog="python -m trainyard.backends.local.netns")
    parser.add_argument("group_dir", type=Path)
    parser.add_argument("--forward", type=int, action="append", default=[])
    parser.add_argument("--idle-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    try:
        return run_keeper(args.group_dir, args.forward, args.idle_s)
    except OSError as exc:
        if exc.errno != errno.EINTR:
            sys.stderr.write(f"netns keeper: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
