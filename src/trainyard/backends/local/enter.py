"""Entering a running local task (``workflow exec``, ``port-forward``, ``rsync``).

``python -m trainyard.backends.local.enter PID CREATED -- CMD...`` (``enter_argv``) runs CMD
in every namespace of the task's sandbox init (``find_sandbox_init``): opened first, checked to
be the same process (its create time), ``setns`` into each (user last), ``chroot``, fork, and
every capability dropped (``no_new_privs``) before anything of the task's file system runs.
The command has no more privilege than the task; its environment is minimal (``PATH``,
``HOME=/root``, ``TERM``, ``LANG``). ``connect_inside(pid, address, port)`` opens a TCP
connection from inside the task's network namespace. Needs the privileges to ``setns``
(root). Why in this order: docs/security.md, "Entering a running task".
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import sys
import threading
from pathlib import Path

import psutil

from trainyard.errors import RefusedError
from trainyard.linux.libc import libc as c_library

__all__ = [
    "machine_id",
    "relay",
    "find_sandbox_init",
    "enter_argv",
    "connect_inside",
    "main",
    "NAMESPACES",
]

NAMESPACES = ("ipc", "uts", "net", "pid", "mnt", "user")
"""The namespaces entered, in order: the user namespace last (a caller with privileges on the
host enters the others with them)."""
_CLONE = {
    "ipc": 0x08000000,
    "uts": 0x04000000,
    "net": 0x40000000,
    "pid": 0x20000000,
    "mnt": 0x00020000,
    "user": 0x10000000,
}
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_LAST = 63
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_TIOCSCTTY = 0x540E
TASK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def machine_id() -> str:
    """This machine's boot id (``/proc/sys/kernel/random/boot_id``): the CLI enters a task
    only where the server that named it runs."""
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _nspid(proc: psutil.Process) -> list[str]:
    with open(f"/proc/{proc.pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("NSpid:"):
                return line.split()[1:]
    return []


def find_sandbox_init(runner_pid: int, runner_created: float, run_dir: Path) -> psutil.Process:
    """The bwrap init process (PID 1 of the task's PID namespace) of the attempt whose runner
    is ``runner_pid`` (a forked runner, or the launcher for a hosted one) and whose sandbox
    root is ``<run_dir>/sandbox/root``.

    Raises:
        RefusedError: the runner is gone (the task ended) or runs no bubblewrap sandbox
            (sandbox ``none``, a podman container, or not yet started).
    """
    try:
        runner = psutil.Process(runner_pid)
        if abs(runner.create_time() - runner_created) > 0.01:
            raise psutil.NoSuchProcess(runner_pid)
        children = runner.children(recursive=True)
    except psutil.Error:
        raise RefusedError("the task's runner is gone: the task has ended") from None
    root = f"{run_dir}/sandbox/root"
    for proc in children:
        try:
            if proc.name() == "bwrap" and _nspid(proc)[-1:] == ["1"] and root in proc.cmdline():
                return proc
        except (psutil.Error, OSError):
            continue
    raise RefusedError(
        "no bubblewrap sandbox runs for this task (its pool runs tasks without "
        "one, in a container, or its command has not started or has ended); "
        "exec, port-forward and rsync need the local bubblewrap sandbox"
    )


def enter_argv(
    pid: int, created: float, command: list[str], *, tty: bool = False, python: str = sys.executable
) -> list[str]:
    """The host command that runs ``command`` inside the namespaces of process ``pid``
    (created at ``created``, Unix seconds); with ``tty``, the command's stdin is made its
    controlling terminal (give it a pty's slave)."""
    return [
        python,
        "-m",
        "trainyard.backends.local.enter",
        str(pid),
        repr(created),
        *(["--tty"] if tty else []),
        "--",
        *command,
    ]


def connect_inside(pid: int, address: str, port: int, timeout_s: float = 10.0) -> socket.socket:
    """A TCP connection to ``address:port`` made from the network namespace of ``pid``.

    Raises:
        OSError: the namespace cannot be joined (not permitted) or the connection is refused.
    """
    from trainyard.backends.local.netns import join_namespace, on_own_thread

    def work() -> socket.socket:
        join_namespace(f"/proc/{pid}/ns/net")
        return socket.create_connection((address, port), timeout=timeout_s)

    sock = on_own_thread(work, "connect-inside")
    sock.settimeout(None)
    return sock


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` ends, then half-close both ways."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def relay(outer: socket.socket, inner: socket.socket) -> None:
    """Copy bytes both ways until both directions end, then close both sockets (one
    connection of ``workflow port-forward``, in the user's own CLI process: a thread per
    direction is fine there)."""
    back = threading.Thread(target=_pump, args=(inner, outer), daemon=True)
    back.start()
    _pump(outer, inner)
    back.join()
    outer.close()
    inner.close()


# ---------------------------------------------------------------------- the entering process


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _open_target(pid: int, created: float) -> tuple[dict[str, int], int]:
    """Descriptors of the namespaces and root of ``pid``, opened while it is surely the
    recorded process (pids are reused)."""
    fds = {
        name: os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC) for name in NAMESPACES
    }
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    if abs(psutil.Process(pid).create_time() - created) > 0.01:
        for fd in (*fds.values(), root):
            os.close(fd)
        raise ProcessLookupError(f"process {pid} is not the task's sandbox any more")
    return fds, root


def _enter(fds: dict[str, int], root: int) -> None:
    libc = c_library()
    own = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in NAMESPACES}
    for name in NAMESPACES:
        if os.fstat(fds[name]).st_ino != own[name]:  # setns into one's own user ns fails
            _check(libc.setns(fds[name], _CLONE[name]), f"setns({name})")
        os.close(fds[name])
    os.fchdir(root)
    os.chroot(".")
    os.close(root)
    os.chdir("/")


def _drop_privileges() -> None:
    """Uid and gid 0 of the task's user namespace, no capabilities at all, no new ones."""
    libc = c_library()
    for setter, name in ((os.setgid, "setgid"), (os.setuid, "setuid")):
        try:
            setter(0)
        except OSError as exc:
            raise OSError(
                exc.errno, f"{name}(0) in the task's user namespace: {exc.strerror}"
            ) from None
    for cap in range(_CAP_LAST + 1):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last: fine
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x2: all zero
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _environment() -> dict[str, str]:
    env = {"PATH": TASK_PATH, "HOME": "/root", "LANG": os.environ.get("LANG", "C.UTF-8")}
    if "TERM" in os.environ:
        env["TERM"] = os.environ["TERM"]
    return env


def _run_child(command: list[str], tty: bool) -> None:
    """In the forked child (already in the PID namespace): drop privileges and exec."""
    try:
        if tty:
            os.setsid()
            fcntl.ioctl(0, _TIOCSCTTY, 0)
        _drop_privileges()
        os.execvpe(command[0], command, _environment())
    except OSError as exc:
        sys.stderr.write(f"trainyard exec: {command[0]}: {exc.strerror or exc}\n")
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


def main(argv: list[str] | None = None) -> int:
    """``python -m trainyard.backends.local.enter PID CREATED [--tty] -- CMD...``; returns the
    command's exit status (128+N for a signal, as a shell does)."""
    args = sys.argv[1:] if argv is None else argv
    if "--" not in args or len(args) < 4:
        sys.stderr.write(
            "usage: python -m trainyard.backends.local.enter PID CREATED [--tty] -- CMD...\n"
        )
        return 2
    split = args.index("--")
    head, command = args[:split], args[split + 1 :]
    pid, created, tty = int(head[0]), float(head[1]), "--tty" in head[2:]
    try:
        fds, root = _open_target(pid, created)
        _enter(fds, root)
    except (OSError, psutil.Error) as exc:
        sys.stderr.write(f"trainyard exec: cannot enter the task's sandbox: {exc}\n")
        return 125
    c_library().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # the task may not ptrace this holder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _run_child(command, tty)
    _pid, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main())
