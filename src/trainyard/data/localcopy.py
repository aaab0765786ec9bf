"""Copying one local file while hashing the bytes written (issue 11: datasets at the speed of
``cp -r``, checked). ``storage.copy_hashing`` is the caller; this module knows file
descriptors, not URLs, algorithms or temp names.

Two ways, chosen by size (numbers measured on the 2-CPU dev VM, docs/benchmarks-history.md):

* below ``PIPELINE_MIN_BYTES``: read into one reused per-thread buffer of ``BUFFER_BYTES``
  (small enough to stay in the CPU's L2 cache), hash it, write it. Few system calls per file
  (open, fstat, read, write, fstat, close; the read that would only confirm the end is
  skipped when the bytes expected are in), no per-file allocation: what bounds a dataset of
  many small files is per-file cost, not bytes.
* from ``PIPELINE_MIN_BYTES`` up: the kernel copies ``PIPELINE_CHUNK_BYTES`` at a time
  (``os.copy_file_range``, as GNU ``cp`` does: no copy through user space) while a helper
  thread hashes the previous chunk where it was written (a read-only ``mmap`` of the target:
  the page cache the copy just filled, so the digest is of the bytes written), up to
  ``PIPELINE_DEPTH`` chunks behind. The copy and the hash overlap; hashing releases the GIL.
  Where the kernel refuses the copy (another filesystem, an old kernel: ``EXDEV``,
  ``EINVAL``, ``ENOSYS``, ``EOPNOTSUPP``) the buffered way is used.

A copy checks that the source did not change while it was read (size and mtime of the open
file before and after, and the count of bytes copied): ``SourceChanged`` otherwise.

The mapping of the target is read only after its bytes were written, and only those bytes, so
it cannot fault on a file that is shorter than mapped unless another process of the same user
truncates the freshly created file meanwhile (which could as well kill the process).

The copy helper process (``copyworker``) runs this module by its file path in a fresh
interpreter and copies with ``copy_file`` too (``serve``, at the end): so the module imports
only the standard library, and that lazily where it can.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from collections import deque
from collections.abc import Callable

TYPE_CHECKING = False  # typing's, without importing typing: the copy helper starts 7 ms sooner
if TYPE_CHECKING:  # concurrent.futures is imported where used (8 ms more)
    from concurrent.futures import Future
    from typing import Protocol

    class Hasher(Protocol):
        """What ``hashlib`` and ``blake3`` objects offer: ``update`` with any bytes-like
        object (``hexdigest`` is the caller's)."""

        def update(self, data: bytes | bytearray | memoryview | mmap.mmap, /) -> object: ...


__all__ = [
    "SourceChanged",
    "copy_file",
    "copy_order",
    "frame",
    "unframe",
    "serve",
    "serve_stdio",
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
    from concurrent.futures import ThreadPoolExecutor

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


# ---------------------------------------------------------------------------- copy helper
# The side of ``copyworker`` that runs in the helper process: this module is loaded there by
# its file path under ``python -I -S`` (no trainyard package, no site), so the helper copies
# with this very ``copy_file``, under the same rules as the parent's own copies.
#
# Wire format (both ways, no JSON: a path may hold any byte but NUL, and ``json`` would add
# 3 ms to the helper's start): a frame is ``b"<length>\n"`` and that many bytes of fields
# joined by NUL. An order is 4 fields (source, target, temp or empty, algo); an answer is 2
# (size, hex digest) or (empty, ``ErrorName: message``).


def frame(fields: list[bytes]) -> bytes:
    """The frame of ``fields`` (none may hold a NUL)."""
    payload = b"\0".join(fields)
    return b"%d\n" % len(payload) + payload


def unframe(payload: bytes, width: int) -> list[list[bytes]]:
    """The records of ``width`` fields in a frame's payload. Raises ValueError."""
    fields = payload.split(b"\0") if payload else []
    if len(fields) % width:
        raise ValueError(f"{len(fields)} fields are not records of {width}")
    return [fields[i : i + width] for i in range(0, len(fields), width)]


def _hasher_class(algo: str) -> Callable[[], Hasher]:
    if algo == "sha256":
        import hashlib

        return hashlib.sha256
    if algo == "blake3":
        import blake3  # the parent adds the folder it imports blake3 from to the path

        return blake3.blake3  # type: ignore[no-any-return]
    raise ValueError(f"unknown digest algorithm {algo!r}")


def copy_order(order: list[bytes], hashers: dict[str, Callable[[], Hasher]]) -> list[bytes]:
    """Copy one file as ``order`` (source, target, temp or empty, algo) says: ``copy_file``
    with its temp rule. Returns the answer: (size, hex digest), or (empty, ``ErrorName:
    message``) when it failed (``copy_file`` removed what it wrote). Never raises for a
    file's own failure."""
    source, target, temp, algo_bytes = order
    try:
        algo = algo_bytes.decode()
        make = hashers.get(algo) or hashers.setdefault(algo, _hasher_class(algo))
        hasher = make()
        size = copy_file(
            os.fsdecode(source),
            os.fsdecode(target),
            hasher,
            None,
            os.fsdecode(temp) if temp else None,
        )
        return [b"%d" % size, hasher.hexdigest().encode()]  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which redoes the file
        text = f"{type(exc).__name__}: {exc}".encode(errors="replace")
        return [b"", text.replace(b"\0", b" ")]


def serve(
    read_line: Callable[[], bytes], read: Callable[[int], bytes], write: Callable[[bytes], object]
) -> None:
    """The helper's loop: each frame read is a chunk of orders; the answer is one frame of
    their answers, in order. Ends at the end of input."""
    hashers: dict[str, Callable[[], Hasher]] = {}
    while header := read_line():
        payload = read(int(header))
        answers: list[bytes] = []
        for order in unframe(payload, 4):
            answers += copy_order(order, hashers)
        write(frame(answers))


def serve_stdio() -> None:
    """``serve`` on standard input and output (the helper's entry point)."""
    import sys

    stdin, out = sys.stdin.buffer, sys.stdout.buffer

    def write(data: bytes) -> None:
        out.write(data)
        out.flush()

    serve(stdin.readline, stdin.read, write)
