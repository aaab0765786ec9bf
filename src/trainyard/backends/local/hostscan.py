"""What of the host a task must not read: files and folders only root (or its group) may
read, found by scans made once per process (``secret_covers``, ``_scan_root_only``) and
covered in the sandbox (bwrap arguments). See docs/local-backend.md "The task sandbox".
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable
from pathlib import Path

from trainyard.backends.local.sandboxplan import _SCAN_LOCK, SECRET_SCAN

__all__ = ["secret_covers"]


@functools.lru_cache(maxsize=16)
def _scan_root_only(host_root: str, rel: str) -> tuple[tuple[str, bool], ...]:
    return tuple(_covers_below(host_root, os.path.join(host_root, rel), _root_only, None))


def _covers_below(
    host_root: str, top: str, hidden: Callable[[str], bool], depth: int | None
) -> list[tuple[str, bool]]:
    """Each file or folder below ``top`` for which ``hidden(path)`` holds, as (path inside the
    sandbox, is a folder); a hidden folder's contents are not listed again, and folders
    ``depth`` levels below ``top`` are not entered (None: all the way)."""
    found: list[tuple[str, bool]] = []
    for current, dirs, names in os.walk(top):
        level = os.path.relpath(current, top).count(os.sep) + (current != top)
        keep = []
        for name in sorted(dirs):
            path = os.path.join(current, name)
            if hidden(path):
                found.append(("/" + os.path.relpath(path, host_root), True))
            elif depth is None or level + 1 < depth:
                keep.append(name)
        dirs[:] = keep
        found += [
            ("/" + os.path.relpath(os.path.join(current, n), host_root), False)
            for n in sorted(names)
            if hidden(os.path.join(current, n))
        ]
    return found


def _root_only(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if stat.S_ISREG(info.st_mode) and info.st_size == 0:
        return False  # an empty file (dpkg's lock files) holds nothing to hide
    if info.st_uid != 0 and info.st_gid != 0:
        return False  # not mapped to the task's ids: its mode applies to the task as to others
    closed_dir = stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH
    return closed_dir or _mode_hides(info.st_mode)  # others may not read (or pass) it


def _cover_args(covers: tuple[tuple[str, bool], ...]) -> list[str]:
    args: list[str] = []
    for inside, is_dir in covers:
        if is_dir:
            args += ["--tmpfs", inside, "--remount-ro", inside]
        else:
            args += ["--ro-bind", "/dev/null", inside]
    return args


def secret_covers(host_root: Path = Path("/")) -> tuple[tuple[str, bool], ...]:
    """The host's files and folders under ``SECRET_SCAN`` that others may not read (mode
    without ``o+r``: ``/etc/shadow``, ``/etc/gshadow``, ``/etc/ssh/ssh_host_*_key``,
    ``/etc/munge``, ``/etc/ssl/private``, ``/var/lib/containers``...), as (path inside, is a
    folder), a folder's contents not listed again. The sandbox covers each (an empty
    read-only folder, or ``/dev/null``): a task's uid 0 is the host's uid 0 for file
    permissions (``PRIVILEGE_ARGS``), so the owner's read bit would let it read them. A deny
    list by file mode, looked at once per process: a secret readable by others, or one made
    after the backend started, is not covered.
    """
    with _SCAN_LOCK:
        return _scan_secrets(str(host_root))


@functools.lru_cache(maxsize=8)
def _scan_secrets(host_root: str) -> tuple[tuple[str, bool], ...]:
    found: list[tuple[str, bool]] = []
    for folder, depth in SECRET_SCAN:
        top = os.path.join(host_root, folder)
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        found += _covers_below(host_root, top, _hidden_from_others, depth)
    return tuple(found)


def _hidden_from_others(path: str) -> bool:
    try:
        return _mode_hides(os.lstat(path).st_mode)
    except OSError:
        return False


def _mode_hides(mode: int) -> bool:
    """A regular file or folder (not a link, device...) that others may not read."""
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return False
    return not mode & stat.S_IROTH


def _secret_args(host_root: Path) -> list[str]:
    """bwrap arguments covering ``secret_covers``."""
    args: list[str] = []
    for inside, is_dir in secret_covers(host_root):
        if is_dir:
            args += ["--tmpfs", inside, "--remount-ro", inside]
        else:
            args += ["--ro-bind", "/dev/null", inside]
    return args
