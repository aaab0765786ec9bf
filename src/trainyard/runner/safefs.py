"""File system steps the runner does for a sandboxed task from outside its sandbox, safely.

- ``write_inside``: write a file into a folder the task controls (its sandbox root, an
  overlay's merged view, its output folder) without following any symlink below that folder.
  The task may have left symlinks there in an earlier attempt (RESTART keeps its root):
  ``ln -s /etc /app`` then ``files: [{path: /app/x}]`` must not write the host's ``/etc/x``.
  Each component is opened with ``O_NOFOLLOW`` relative to the folder before it (``openat``
  with directory descriptors), so a symlink anywhere on the way is refused, never followed,
  and a folder swapped for a symlink between two steps is refused too.
- ``mount_overlays``: move the calling thread into a mount namespace of its own and mount
  the task's private writable layers (``OverlayMount``) there. Mount namespaces belong to a
  thread (``unshare(2)`` with ``CLONE_NEWNS`` implies ``CLONE_FS``, allowed in a threaded
  process); the processes it starts, and threads it starts after, inherit it; the host's
  mount table never sees the overlays, and they go away with the last process using them.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Sequence

from trainyard.runner.spec import OverlayMount

__all__ = ["write_inside", "mount_overlays", "SymlinkRefused"]

_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18


class SymlinkRefused(OSError):
    """A path component inside the task's folder is a symlink (or not a folder)."""


def _open_dir(parent_fd: int, name: str, create: bool) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        try:
            os.mkdir(name, 0o755, dir_fd=parent_fd)
        except FileExistsError:
            pass  # made meanwhile; opened below with the same checks
        return os.open(name, flags, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SymlinkRefused(exc.errno, f"{name!r} is a symlink or not a folder; "
                                 "the runner follows no link the task made") from exc
        raise


def write_inside(base: str, relative: str, text: str, mode: int = 0o755) -> None:
    """Write ``text`` to ``base/relative``, making missing folders, following no symlink
    below ``base`` (``base`` itself is the backend's, trusted).

    Raises:
        SymlinkRefused: a component of ``relative`` is a symlink (or a file where a folder
            is needed).
        OSError: anything else (read-only file system, no space, ``relative`` empty).
    """
    parts = [p for p in relative.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, f"not a file path below the task's folder: {relative!r}")
    os.makedirs(base, exist_ok=True)  # the backend's folder (a root made on first use)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            next_fd = _open_dir(fd, name, create=True)
            os.close(fd)
            fd = next_fd
        _write_file(fd, parts[-1], text, mode)
    finally:
        os.close(fd)


def _write_file(dir_fd: int, name: str, text: str, mode: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkRefused(exc.errno, f"{name!r} is a symlink; the runner follows no "
                                 "link the task made") from exc
        raise
    try:
        os.fchmod(fd, mode)
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as handle:
            handle.write(text)
    finally:
        os.close(fd)


def mount_overlays(overlays: Sequence[OverlayMount]) -> None:
    """Give the calling thread a private mount namespace holding ``overlays`` (see module
    docstring). Idempotent per thread only in the sense that calling it with no overlays
    does nothing. Needs CAP_SYS_ADMIN (root).

    Raises:
        OSError: the kernel refused (naming the step and the folder).
    """
    if not overlays:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    _check(libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None),
           "making / private in the task's mount namespace")
    for layer in overlays:
        for folder in (layer.upper, layer.work, layer.target):
            os.makedirs(folder, exist_ok=True)
        options = (f"lowerdir={_escaped(layer.lower)},upperdir={_escaped(layer.upper)},"
                   f"workdir={_escaped(layer.work)}")
        _check(libc.mount(b"overlay", layer.target.encode(), b"overlay", 0, options.encode()),
               f"overlay over {layer.lower} at {layer.target}")


def _escaped(path: str) -> str:
    """A path as overlayfs' option parser wants it (``\\``, ``,`` and ``:`` escaped)."""
    return path.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:")


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
