"""Start a program as another uid from one thread of a threaded process, without a helper
program and without forking (``as_ids``).

The runner starts bwrap as the task's host uid (``linux.userns``). ``subprocess.Popen``'s
``user``/``group`` make CPython fork instead of ``vfork`` (~2.5 ms of CPU per task in the
launcher), and ``nsenter --setuid`` is one more ``exec`` per task (~1 ms of CPU with its
dynamic loading). Linux keeps credentials per thread (credentials(7), "the POSIX threads
... require that credentials are shared by all of the threads in a process", which glibc's
wrappers emulate by signalling every thread; the system calls themselves change only the
caller's): so the calling thread switches its own ids with the raw system calls, starts the
program (``vfork`` copies the thread's credentials into the child, and ``execve`` sets the
saved ids to the effective ones), and switches back. The saved uid stays 0 meanwhile, so the
way back needs no capability (setresuid(2): "an unprivileged process may change its real,
effective and saved UID each to one of: the current real UID, the current effective UID or
the current saved set-user-ID"), and the permitted capabilities stay (capabilities(7),
"Effect of user ID changes on capabilities": they are cleared only when all three ids become
nonzero); only the effective set goes while the effective uid is not 0 and comes back with it.
Other threads keep running as root throughout.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
from collections.abc import Iterator

from trainyard.linux.libc import libc as c_library

__all__ = ["available", "as_ids"]

_SYSCALLS = {  # (setgroups, setresuid, setresgid): asm/unistd_64.h, asm-generic/unistd.h
    "x86_64": (116, 117, 119),
    "aarch64": (159, 147, 149),
}


def available() -> bool:
    """Whether ``as_ids`` works here: as root, on an architecture whose system call numbers
    are known (x86-64, arm64)."""
    return os.geteuid() == 0 and platform.machine() in _SYSCALLS


@contextlib.contextmanager
def as_ids(uid: int, gid: int) -> Iterator[None]:
    """Within the block the calling thread alone has real and effective uid ``uid``, gid
    ``gid`` and no supplementary group (what ``nsenter --setuid --setgid`` gives); saved ids
    stay the caller's. A program started in the block with ``vfork`` (``subprocess.Popen``
    without ``user``/``preexec_fn``) runs with those ids and no capability. Do nothing else
    in the block: files are opened as ``uid``.

    Raises:
        OSError: a switch was refused (EPERM: not root), or the architecture is not known
            (ENOSYS); the thread's ids are then as before. A failure to switch back (which
            the saved ids rule out) is raised too: the thread must not go on.
    """
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise OSError(errno.ENOSYS, f"no known system call numbers on {platform.machine()}")
    setgroups, setresuid, setresgid = numbers
    libc = c_library()
    ruid, euid, suid = os.getresuid()
    rgid, egid, sgid = os.getresgid()
    groups = os.getgroups()
    _call(libc, setgroups, 0, None)
    try:
        _call(libc, setresgid, gid, gid, sgid)
        try:
            _call(libc, setresuid, uid, uid, suid)
            try:
                yield
            finally:
                _call(libc, setresuid, ruid, euid, suid)
        finally:
            _call(libc, setresgid, rgid, egid, sgid)
    finally:
        group_array = (ctypes.c_uint * max(len(groups), 1))(*groups)
        _call(libc, setgroups, len(groups), group_array)


def _call(libc: ctypes.CDLL, number: int, *args: object) -> None:
    if libc.syscall(ctypes.c_long(number), *args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"system call {number}: {os.strerror(code)}")
