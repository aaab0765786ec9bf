"""Unpack a tar stream that a task produced, and place the result, following no link.

What a task sends is an attacker's: ``workflow rsync download`` must write nothing outside
the folder the user named, whatever Python's ``tarfile`` filters let through (CVE-2025-4517:
the ``data`` filter of Python <= 3.13.3 checks links with ``os.path.realpath``, which stops
resolving past ``PATH_MAX``). This module checks nothing through the file system's own path
resolution: every folder is opened with ``O_NOFOLLOW`` relative to the one before it
(``openat``), every file made with ``O_CREAT | O_EXCL | O_NOFOLLOW``, and symlinks are
resolved by reading them one by one (``resolve_inside``), never by the kernel.

Refused (``UnsafeArchive``): absolute names, ``..`` in a name, links (symbolic or hard) whose
target lies outside the folder, devices, FIFOs, and a name that would pass through a symlink.
"""

from __future__ import annotations

import errno
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

__all__ = ["UnsafeArchive", "extract", "place", "resolve_inside"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK_BYTES = 1 << 20
MAX_LINK_HOPS = 40
"""Symlinks followed while resolving one link, as Linux's own limit (``path_resolution(7)``)."""


class UnsafeArchive(Exception):
    """A member would land, or point, outside the destination; the message names it."""


def member_parts(name: str) -> tuple[str, ...]:
    """The path components of a member name, ``./`` and empty components dropped.

    Raises:
        UnsafeArchive: the name is absolute or has a ``..`` component.
    """
    if name.startswith("/"):
        raise UnsafeArchive(f"{name!r}: an absolute name")
    parts = tuple(p for p in PurePosixPath(name).parts if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchive(f"{name!r}: a name with '..'")
    return parts


def extract(stream: IO[bytes], dest: Path) -> int:
    """Unpack the tar ``stream`` (read once, start to end) into the folder ``dest``.

    ``dest`` should be new and empty (a staging folder). Regular files, folders, symlinks and
    hard links are made; modes keep their permission bits less setuid, setgid, sticky and
    group/other write (as ``tarfile``'s ``data`` filter); owners are the caller's.

    Returns:
        the number of members unpacked.
    Raises:
        UnsafeArchive: a member is refused (nothing is made outside ``dest`` either way).
        tarfile.TarError: the stream is no tar archive.
    """
    root_fd = os.open(dest, _DIR_FLAGS)
    dir_modes: list[tuple[tuple[str, ...], int]] = []
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as archive:
            for member in archive:
                parts = member_parts(member.name)
                if not parts:
                    continue  # the top folder itself ('./')
                _extract_member(archive, member, parts, root_fd, dir_modes)
                count += 1
        for parts, mode in reversed(dir_modes):  # deepest last-made first: still writable
            fd = _walk(root_fd, parts, create=False)
            try:
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        _check_links(dest)
    finally:
        os.close(root_fd)
    return count


def _extract_member(
    archive: tarfile.TarFile,
    member: tarfile.TarInfo,
    parts: tuple[str, ...],
    root_fd: int,
    dir_modes: list[tuple[tuple[str, ...], int]],
) -> None:
    if member.isdir():
        fd = _walk(root_fd, parts, create=True)
        os.close(fd)
        dir_modes.append((parts, (member.mode & 0o755) | 0o700))
        return
    if not (member.isreg() or member.issym() or member.islnk()):
        raise UnsafeArchive(f"{member.name!r}: a device, FIFO or other special file")
    parent = _walk(root_fd, parts[:-1], create=True)
    try:
        _remove_file(parent, parts[-1], member.name)
        if member.isreg():
            _write_file(archive, member, parent, parts[-1])
        elif member.issym():
            _check_symlink_target(parts, member.linkname, member.name)
            os.symlink(member.linkname, parts[-1], dir_fd=parent)
        else:
            _hard_link(root_fd, parent, parts[-1], member)
    finally:
        os.close(parent)


def _hard_link(root_fd: int, parent: int, name: str, member: tarfile.TarInfo) -> None:
    """A hard link to a regular file unpacked before it, found following no link."""
    refused = UnsafeArchive(
        f"{member.name!r}: a hard link to {member.linkname!r}, which is no file unpacked before it"
    )
    target = member_parts(member.linkname)
    if not target:
        raise refused
    try:
        source = _walk(root_fd, target[:-1], create=False)
    except FileNotFoundError:
        raise refused from None
    try:
        info = os.stat(target[-1], dir_fd=source, follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode):
            raise refused
        os.link(target[-1], name, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise refused from None
    finally:
        os.close(source)


def _write_file(archive: tarfile.TarFile, member: tarfile.TarInfo, parent: int, name: str) -> None:
    source = archive.extractfile(member)
    assert source is not None
    fd = os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
    try:
        while chunk := source.read(_CHUNK_BYTES):
            os.write(fd, chunk)  # a regular file: one write takes the whole chunk
        os.fchmod(fd, (member.mode & 0o755) | 0o600)
        os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(fd)


def _remove_file(parent: int, name: str, shown: str) -> None:
    """A later member of the same name replaces an earlier file or link (tar's rule), never
    a folder."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        raise UnsafeArchive(f"{shown!r}: a folder of that name was unpacked before it")
    os.unlink(name, dir_fd=parent)


def _walk(root_fd: int, parts: tuple[str, ...], create: bool) -> int:
    """Open the folder ``parts`` below ``root_fd`` one component at a time, with
    ``O_NOFOLLOW``; with ``create``, make missing ones (0700). Returns a new descriptor.

    Raises:
        UnsafeArchive: a component is a symlink or no folder.
    """
    fd = os.dup(root_fd)
    for index, name in enumerate(parts):
        try:
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o700, dir_fd=fd)
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                where = "/".join(parts[: index + 1])
                raise UnsafeArchive(
                    f"{where!r} is a symlink or no folder; nothing is unpacked through it"
                ) from None
            raise
        os.close(fd)
        fd = next_fd
    return fd


def _check_symlink_target(parts: tuple[str, ...], target: str, shown: str) -> None:
    if not target or target.startswith("/"):
        raise UnsafeArchive(f"{shown!r}: a symlink to {target!r} (absolute or empty)")
    depth = len(parts) - 1
    for part in PurePosixPath(target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise UnsafeArchive(f"{shown!r}: a symlink to {target!r}, outside the folder")


def resolve_inside(root: Path, parts: tuple[str, ...]) -> tuple[str, ...]:
    """Resolve ``parts`` below ``root`` as the kernel would, reading each symlink met on the
    way with ``readlink`` (never following one), and return the resolved components.

    Raises:
        UnsafeArchive: the path leaves ``root`` (an absolute link, or ``..`` above it), or
            more than ``MAX_LINK_HOPS`` links are met.
    """
    pending = list(parts)
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise UnsafeArchive(f"{'/'.join(parts)!r} leads outside the folder")
            resolved.pop()
            continue
        here = root.joinpath(*resolved, part)
        try:
            info = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            resolved.append(part)  # dangling from here on: the rest stays lexical
            continue
        if not stat.S_ISLNK(info.st_mode):
            resolved.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            raise UnsafeArchive(f"{'/'.join(parts)!r}: more than {MAX_LINK_HOPS} symlinks")
        target = os.readlink(here)
        if target.startswith("/"):
            raise UnsafeArchive(f"{'/'.join(parts)!r} leads to {target!r}, outside the folder")
        pending = [*PurePosixPath(target).parts, *pending]
    return tuple(resolved)


def _links(dest: Path) -> Iterator[tuple[str, ...]]:
    for folder, dirs, files in os.walk(dest):  # os.walk follows no symlinked folder
        below = Path(folder).relative_to(dest).parts
        for name in [*dirs, *files]:
            if os.path.islink(os.path.join(folder, name)):
                yield (*below, name)


def _check_links(dest: Path) -> None:
    """Every symlink unpacked must resolve inside ``dest`` once all members are there (a
    later member can turn an earlier link's path into one that leaves: ``a -> s/..`` with
    ``s -> .``)."""
    for parts in _links(dest):
        resolve_inside(dest, parts)


def place(copied: Path, local: Path) -> None:
    """Move what ``extract`` made at ``copied`` to ``local``, on the same file system.

    A file, or a folder when ``local`` does not exist, moves as a whole (``rename``). Into an
    existing folder, entries move one by one: a file or link replaces the entry of its name
    (never following it); a folder merges with a folder of its name.

    Raises:
        UnsafeArchive: a folder would merge into something that is no folder (a symlink
            included: nothing is placed through a link already at ``local``).
    """
    if not (copied.is_dir() and not copied.is_symlink() and local.is_dir()):
        os.replace(copied, local)
        return
    src_fd = os.open(copied, _DIR_FLAGS)
    dst_fd = os.open(local, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's own
    try:
        _merge(src_fd, dst_fd, str(local))
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _merge(src_fd: int, dst_fd: int, shown: str) -> None:
    for name in os.listdir(src_fd):
        info = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        try:
            there = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
        except FileNotFoundError:
            there = None
        if not stat.S_ISDIR(info.st_mode) or there is None:
            if there is not None and stat.S_ISDIR(there.st_mode):
                raise UnsafeArchive(f"{shown}/{name} is a folder; the copy has a file there")
            os.rename(name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            continue
        if not stat.S_ISDIR(there.st_mode):
            raise UnsafeArchive(
                f"{shown}/{name} is a symlink or file; the copy has a folder "
                "there (nothing is placed through it)"
            )
        sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
        try:
            sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
        except OSError:
            os.close(sub_src)
            raise UnsafeArchive(f"{shown}/{name} changed while the copy was placed") from None
        try:
            _merge(sub_src, sub_dst, f"{shown}/{name}")
        finally:
            os.close(sub_src)
            os.close(sub_dst)
