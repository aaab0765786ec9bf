"""A small helper process that sets ``user.max_user_namespaces`` to 0 in a task's user
namespace (``linux.userns``: no nested user namespaces), for a threaded process that hosts
runners (the local backend's launcher): only a single-threaded process may ``setns(2)`` into a
user namespace. A bare interpreter (``python -S -E``) started once per launcher forks, per
task, a child that joins the namespace and writes the file.

Protocol: a ``SOCK_SEQPACKET`` socket pair; the caller sends the pid (4 bytes) of a process in
the task's user namespace, the gate answers 4 bytes: 0, or the errno (or -signal) its child
ended with. One request at a time. The gate exits when the socket closes. Where there is no
gate, ``forbid_nested`` returns False and the caller uses ``nsenter``. Why a gate:
docs/local-backend.md, "The namespace gate".
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys
import threading

__all__ = ["start", "forbid_nested", "running"]

_GATE = r'''
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
sock = int(sys.argv[1])
while True:
    data = os.read(sock, 4)
    if len(data) != 4:
        break
    pid = struct.unpack("=i", data)[0]
    child = os.fork()
    if child == 0:
        code = 0
        try:
            fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY)
            if libc.setns(fd, 0x10000000) != 0:
                code = ctypes.get_errno() or 1
            else:
                out = os.open("/proc/sys/user/max_user_namespaces", os.O_WRONLY)
                os.write(out, b"0")
        except OSError as exc:
            code = exc.errno or 1
        os._exit(min(code, 255))
    _, status = os.waitpid(child, 0)
    os.write(sock, struct.pack("=i", os.waitstatus_to_exitcode(status)))
'''

_lock = threading.Lock()
_state: dict[str, object] = {}  # "owner": pid, "sock": socket, "proc": Popen


def _forget_after_fork() -> None:
    """In a child of ``os.fork``: no gate. Another thread of the parent may have held
    ``_lock`` at the fork (a hosted runner asking the gate), which no thread of the child would
    ever release: a forked runner then hung in ``forbid_nested`` before its command started
    (seen in CI: a task RUNNING until its exec timeout). The child's copy of the gate's socket
    is closed too, so that the gate sees its launcher's end even while forked runners live."""
    global _lock
    _lock = threading.Lock()
    sock = _state.get("sock")
    _state.clear()
    if isinstance(sock, socket.socket):
        sock.close()


os.register_at_fork(after_in_child=_forget_after_fork)


def start(python: str = sys.executable) -> str | None:
    """Start this process's gate (call it from a thread in the host's namespaces: the gate
    keeps the ones it starts in). Idempotent. Returns None, or why there is none (the
    callers then fall back to ``nsenter``)."""
    with _lock:
        if running():
            return None
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [python, "-S", "-E", "-c", _GATE, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                close_fds=True,
            )
        except OSError as exc:
            mine.close()
            return f"cannot start the user namespace gate: {exc}"
        finally:
            theirs.close()
        _state.update(owner=os.getpid(), sock=mine, proc=proc)
        return None


def running() -> bool:
    """Whether this process has a live gate."""
    proc = _state.get("proc")
    return (
        _state.get("owner") == os.getpid()
        and isinstance(proc, subprocess.Popen)
        and proc.poll() is None
    )


def forbid_nested(pid: int) -> bool:
    """Set ``user.max_user_namespaces`` to 0 in the user namespace of ``pid`` through the
    gate. Thread-safe.

    Returns:
        True when done; False when this process has no gate (nothing was tried).

    Raises:
        OSError: the gate's child could not do it (its errno), or the gate stopped answering.
    """
    with _lock:
        if not running():
            return False
        sock = _state["sock"]
        assert isinstance(sock, socket.socket)
        try:
            sock.sendall(struct.pack("=i", pid))
            reply = sock.recv(4)
        except OSError as exc:
            raise OSError(errno.EPIPE, f"the user namespace gate stopped answering: {exc}") from exc
    if len(reply) != 4:
        raise OSError(errno.EPIPE, "the user namespace gate ended")
    code = struct.unpack("=i", reply)[0]
    if code != 0:
        why = os.strerror(code) if code > 0 else f"its child was killed by signal {-code}"
        raise OSError(code if code > 0 else errno.EINTR, why)
    return True
