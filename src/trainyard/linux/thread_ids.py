"""Start a program as another uid from one thread of a threaded process, without a helper
program and without forking (``as_ids``).

Linux keeps credentials per thread (the raw system calls change only the caller's; glibc's
wrappers signal every thread): the calling thread switches its own ids, starts the program
(``vfork`` copies the thread's credentials, ``execve`` sets the saved ids to the effective
ones) and switches back. The saved uid stays 0 meanwhile, so the way back needs no capability
and the permitted capabilities stay; other threads keep running as root. Sources:
credentials(7), setresuid(2), capabilities(7) "Effect of user ID changes on capabilities".
Why not ``Popen(user=)`` or ``nsenter``: docs/local-backend.md, "Switching ids per thread".
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
