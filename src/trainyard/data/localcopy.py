"""One local file copied while the bytes written are hashed (``storage.copy_hashing`` is the
caller; this module knows file descriptors, not URLs or algorithms).

* Below ``PIPELINE_MIN_BYTES``: read, hash and write through one reused per-thread buffer of
  ``BUFFER_BYTES``.
* From ``PIPELINE_MIN_BYTES`` up: the kernel copies ``PIPELINE_CHUNK_BYTES`` at a time
  (``os.copy_file_range``, as GNU ``cp`` does) while one helper thread hashes the chunks
  written (a read-only ``mmap`` of the target), up to ``PIPELINE_DEPTH`` behind; where the
  kernel refuses (``EXDEV``, ``EINVAL``, ``ENOSYS``, ``EOPNOTSUPP``) the buffered way is used.

A source that changes while it is read (size, mtime, bytes copied) raises ``SourceChanged``.
Design and measurements: docs/data.md, docs/benchmarks.md.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol


class Hasher(Protocol):
    """What ``hashlib`` and ``blake3`` objects offer: ``update`` with any bytes-like object
    (``hexdigest`` is the caller's)."""

    def update(self, data: bytes | bytearray | memoryview | mmap.mmap, /) -> object: ...


__all__ = [
    "SourceChanged",
    "copy_file",
    "BUFFER_BYTES",
    "PIPELINE_MIN_BYTES",
    "PIPELINE_CHUNK_BYTES",
    "PIPELINE_DEPTH",
]

BUFFER_BYTES = 256 * 1024
PIPELINE_MIN_BYTES = 16 * 1024 * 1024
PIPELINE_CHUNK_BYTES = 8 * 1024 * 1024  # a multiple of mmap.ALLOCATIONGRANULARITY
PIPELINE_DEPTH = 4  # chunks the hash may lag behind the copy (measured: 0.86x cp vs 0.73x at 1)
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
_READ = os.O_RDONLY | os.O_CLOEXEC
Progress = Callable[[int], object]


class SourceChanged(OSError):
    """The source file changed while it was copied (a permanent error: the copy is not of
    one version of the file)."""


class _NoKernelCopy(Exception):
    """``copy_file_range`` is refused for this pair of files: copy through user space."""


_local = threading.local()


def _buffer() -> tuple[bytearray, memoryview]:
    """This thread's reused copy buffer (allocated once per thread)."""
    found = getattr(_local, "buffer", None)
    if found is None or len(found[0]) != BUFFER_BYTES:
        data = bytearray(BUFFER_BYTES)
        found = _local.buffer = (data, memoryview(data))
    return found


def copy_file(
    source: str,
    target: str,
    hasher: Hasher,
    progress: Progress | None = None,
    temp: str | None = None,
) -> int:
    """Copy ``source`` to ``target`` feeding every byte written to ``hasher``.

    Args:
        source: the local file to read (a ``/proc/self/fd/N`` name works).
        target: where the copy ends up; its folder is created when missing.
        hasher: gets the bytes in order (``update``); the caller reads the digest.
        progress: called with each count of bytes copied.
        temp: write here (created exclusively: a new name) and rename onto ``target`` once
            complete, so that no reader sees half a file; None writes ``target`` in place
            (for folders no reader looks at before a manifest names them).

    Returns:
        The number of bytes copied.

    Raises:
        SourceChanged: the source changed while it was read.
        OSError: reading or writing failed. The file written (``temp`` or ``target``) is
            removed on any error.
    """
    fd_in = os.open(source, _READ)
    try:
        before = os.fstat(fd_in)
        out = temp or target
        fd_out = _create(out, exclusive=temp is not None)
        try:
            try:
                copied = _copy(fd_in, fd_out, before.st_size, hasher, progress)
            finally:
                os.close(fd_out)
            _check_unchanged(source, before, os.fstat(fd_in), copied)
            if temp is not None:
                os.replace(temp, target)
        except BaseException:
            _remove(out)
            raise
    finally:
        os.close(fd_in)
    return copied


def _create(path: str, exclusive: bool) -> int:
    """Open ``path`` for writing (and reading, for the hash's mapping), creating its folder
    when missing. ``exclusive``: a new file (a temp name must not exist); else truncate,
    following no symlink at the last component."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
    flags |= os.O_EXCL if exclusive else os.O_TRUNC | os.O_NOFOLLOW
    try:
        return os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        return os.open(path, flags, 0o666)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _check_unchanged(
    source: str, before: os.stat_result, after: os.stat_result, copied: int
) -> None:
    if (before.st_mtime_ns, before.st_size) != (
        after.st_mtime_ns,
        after.st_size,
    ) or copied != after.st_size:
        raise SourceChanged(
            f"{source} changed while it was copied ({copied} bytes read, {after.st_size} now)"
        )


def _copy(fd_in: int, fd_out: int, size: int, hasher: Hasher, progress: Progress | None) -> int:
    if size < BUFFER_BYTES:
        return _copy_small(fd_in, fd_out, size, hasher, progress)
    if size >= PIPELINE_MIN_BYTES and hasattr(os, "copy_file_range"):
        try:
            return _copy_pipelined(fd_in, fd_out, hasher, progress)
        except _NoKernelCopy:
            pass  # nothing written yet: the buffered copy starts from the beginning
    return _copy_buffered(fd_in, fd_out, size, hasher, progress)


def _copy_buffered(
    fd_in: int, fd_out: int, size: int, hasher: Hasher, progress: Progress | None
) -> int:
    """Read, hash, write through this thread's buffer. A short read once ``size`` bytes are
    in ends the loop (the end of a regular file; a file that grew meanwhile is caught by the
    caller's check), saving the read that would return nothing."""
    data, view = _buffer()
    copied = 0
    while count := os.readv(fd_in, [data]):
        chunk = view[:count]
        hasher.update(chunk)
        _write_all(fd_out, chunk)
        copied += count
        if progress is not None:
            progress(count)
        if count < len(data) and copied >= size:
            break
    return copied


def _copy_small(
    fd_in: int, fd_out: int, size: int, hasher: Hasher, progress: Progress | None
) -> int:
    """A file smaller than the buffer (most of a many-small-files dataset): one read, one
    hash, one write, without the loop's bookkeeping. A read that does not end where
    ``size`` said (the file grew or shrank since its fstat) continues in the buffered loop,
    whose count the caller checks."""
    data, view = _buffer()
    count = os.readv(fd_in, [data])
    chunk = view[:count]
    hasher.update(chunk)
    _write_all(fd_out, chunk)
    if progress is not None and count:
        progress(count)
    if count == size or count == 0:
        return count
    return count + _copy_buffered(fd_in, fd_out, size - count, hasher, progress)


def _write_all(fd: int, chunk: memoryview) -> None:
    while chunk:
        chunk = chunk[os.write(fd, chunk) :]


def _copy_pipelined(fd_in: int, fd_out: int, hasher: Hasher, progress: Progress | None) -> int:
    """The kernel copies chunk n while a helper thread hashes earlier chunks from the target,
    in order (one helper), up to ``PIPELINE_DEPTH`` chunks behind: on a busy machine either
    thread may wait for a CPU, and a deeper queue keeps the other one working meanwhile.
    Raises _NoKernelCopy when the kernel refuses the first chunk."""
    copied = 0
    pending: deque[Future[None]] = deque()
    with ThreadPoolExecutor(1, "trainyard-hash") as helper:
        while count := _kernel_copy(fd_in, fd_out, copied):
            if len(pending) >= PIPELINE_DEPTH:
                pending.popleft().result()
            pending.append(helper.submit(_hash_written, fd_out, copied, count, hasher))
            copied += count
            if progress is not None:
                progress(count)
            if count < PIPELINE_CHUNK_BYTES:
                break  # the end of the file
        while pending:
            pending.popleft().result()
    return copied  # on an error, leaving the block waited for the hashes queued


def _kernel_copy(fd_in: int, fd_out: int, offset: int) -> int:
    """Copy up to one chunk at ``offset`` (same offset in both files); less only at the end
    of the source. Raises _NoKernelCopy when refused at offset 0, OSError otherwise."""
    done = 0
    while done < PIPELINE_CHUNK_BYTES:
        try:
            count = os.copy_file_range(
                fd_in, fd_out, PIPELINE_CHUNK_BYTES - done, offset + done, offset + done
            )
        except OSError as exc:
            if offset + done == 0 and exc.errno in _NO_KERNEL_COPY:
                raise _NoKernelCopy from exc
            raise
        if count == 0:
            break
        done += count
    return done


def _hash_written(fd: int, offset: int, length: int, hasher: Hasher) -> None:
    """Hash ``length`` bytes of ``fd`` at ``offset`` (a multiple of the mmap granularity)
    through a read-only mapping: the page cache, no copy."""
    with mmap.mmap(fd, length, prot=mmap.PROT_READ, offset=offset) as mapped:
        hasher.update(mapped)
