"""A helper process that copies and hashes part of a list of many small local files (issue 11:
datasets at ``cp -r`` speed).

Why a process. A dataset of many small files costs per file, and most of that cost is the
interpreter's between system calls; a second thread only fights the first for the GIL
(docs/benchmarks-history.md, "Many small files"). A second interpreter runs beside the first on
a second CPU. It is spawned (``subprocess``: fork + exec of ``sys.executable -I``, never a
``fork`` of this threaded process that would go on running its code), loads only
``localcopy.py`` by its file path (no trainyard package, nothing of the site's), and copies
each file it is sent with that module's ``copy_file``: the very code, the same rules, as
this process's own copies (temp name created ``O_EXCL`` and renamed, or in place with
``O_TRUNC | O_NOFOLLOW``; the source's size and mtime checked; what it wrote removed on an
error).

How the work is shared. The files go in chunks (``ChunkQueue``: large while much is left,
small at the end) to whoever asks next: this process's own loop and a helper thread that
keeps the worker two chunks ahead (``IN_FLIGHT``: it never waits for this process to read
its answers). A worker that gets no CPU (a busy machine) simply takes fewer chunks.

Nothing is lost. The parent chooses every temp name. A file the worker reports failed, or
whose digest a download does not expect, is done again here with the transfer's usual
retries and messages. A worker that dies, answers nonsense, or says nothing for
``STALL_S`` is killed; the temp files of its unanswered chunk are removed and that chunk is
done here. Files the parent must open following no link (``FileJob.confined``: a task's
folders) are never sent: only the parent's ``safefs`` path opens those.

When. Only where it pays (``pays``): at least ``MIN_FILES`` files to send, two CPUs this
process may run on (``os.sched_getaffinity``), and files below ``MAX_FILE_BYTES`` (larger
ones stay here, where a single chunk cannot hold a worker past ``STALL_S``); the caller
(``transfer.Mover``) adds its own conditions (small files on ``file://``, digests taken,
``DataConfig.workers`` >= 2). Measured in docs/benchmarks-history.md, "Many small files".
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO, NamedTuple

from trainyard.data import localcopy

__all__ = [
    "CopyOrder",
    "Copied",
    "Helper",
    "ChunkQueue",
    "WorkerLost",
    "pays",
    "usable_cpus",
    "MIN_FILES",
    "MAX_FILE_BYTES",
    "CHUNK_FILES",
    "MAX_CHUNK_FILES",
    "STALL_S",
]

MIN_FILES = 500
"""Fewer files than this are not worth a worker's start (about 11 ms of CPU, 15 ms)."""
MAX_FILE_BYTES = 1024 * 1024
"""Files from this size on are copied in this process (a chunk stays short)."""
CHUNK_FILES = 32
"""The smallest chunk, at the end of the list, so that the two sides finish together."""
MAX_CHUNK_FILES = 512
"""The largest chunk (with files below ``MAX_FILE_BYTES``, well within ``STALL_S``)."""
IN_FLIGHT = 2
"""Chunks sent to the worker ahead of its answers: it works on the next one while this
process reads the answers to the last one and prepares another (it never waits for us)."""
PIPE_BYTES = 1024 * 1024
"""The pipes' size (``F_SETPIPE_SZ``; Linux lets any user ask this much): a chunk's orders
and answers fit, so that writing the next chunk never waits for the worker's answers."""
STALL_S = 60.0
"""A worker that answers no chunk in this long is taken for hung: killed, its chunk done here."""

_BOOT = (
    "import sys,_frozen_importlib as b,_frozen_importlib_external as e;"
    "sys.path[:0]=sys.argv[2:];"
    "s=e.spec_from_file_location('trainyard_copy_helper',sys.argv[1]);"
    "m=b.module_from_spec(s);s.loader.exec_module(m);m.serve_stdio()"
)
"""The worker's program: load ``localcopy.py`` from its file (argv[1]; through the import
machinery the interpreter has loaded already, so with its cached bytecode and without
``importlib.util``'s imports: 2 to 6 ms less) with the folders of the hash packages
(argv[2:]) on the path, and serve."""


class CopyOrder(NamedTuple):
    """One file for the worker: ``localcopy.copy_file(source, target, new(algo), None,
    temp)``. ``temp`` None writes ``target`` in place (a staged upload). (A named tuple:
    one is made per file, at a third of a frozen dataclass's cost.)"""

    source: str
    target: str
    temp: str | None
    algo: str

    def wire(self) -> list[bytes]:
        """The order's fields for ``localcopy.frame``."""
        return [
            os.fsencode(self.source),
            os.fsencode(self.target),
            os.fsencode(self.temp) if self.temp else b"",
            self.algo.encode(),
        ]


class Copied(NamedTuple):
    """What the worker copied: size in bytes and hex digest of the bytes written."""

    size: int
    digest: str


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pays(files: int) -> bool:
    """Whether a worker is worth starting for ``files`` files to send (module docstring)."""
    return files >= MIN_FILES and usable_cpus() >= 2


class ChunkQueue:
    """Chunks of job indices handed out once each, in order, to whichever side asks
    (thread-safe); ``stop`` hands out no more.

    Guided sizes: a quarter of what is left (each of the two sides gets about half of the
    rest over its next two chunks), between ``min_files`` and ``max_files``: few round
    trips (each wakes a thread that needs the GIL) while much is left, small chunks at the
    end so that the two sides finish together.
    """

    def __init__(
        self, indices: Sequence[int], min_files: int | None = None, max_files: int | None = None
    ) -> None:
        self._indices = list(indices)
        self._min = min_files or CHUNK_FILES
        self._max = max(self._min, max_files or MAX_CHUNK_FILES)
        self._next = 0
        self._lock = threading.Lock()
        self._stopped = False

    def take(self) -> list[int] | None:
        """The next chunk, None when none is left or after ``stop``."""
        with self._lock:
            start, left = self._next, len(self._indices) - self._next
            if self._stopped or left <= 0:
                return None
            self._next += min(left, max(self._min, min(self._max, left // 4)))
            return self._indices[start : self._next]

    def stop(self) -> None:
        with self._lock:
            self._stopped = True


class WorkerLost(Exception):
    """The worker died, hung past ``STALL_S``, or answered something that is not an answer."""


class Helper:
    """A helper thread driving one worker process.

    ``start`` spawns the worker at once, so that its start (10-20 ms) overlaps the caller's
    preparations; ``feed`` then gives it its work, or ``abort`` drops it (the caller
    decided not to share, or failed). One of the two must follow ``start``.

    Args of ``feed``:
        queue: the chunks to share with the caller's own loop.
        order_of: the ``CopyOrder`` of job ``index`` (called once per index, in the helper
            thread).
        on_chunk: called in the helper thread with (index, ``Copied`` or the worker's error
            text) for each file of a chunk the worker answered; the caller records it or
            decides to redo the file.

    After ``join``: ``lost`` holds the indices of the chunks the worker never answered (their
    temp files removed), for the caller to do itself; the caller's loop took the others.
    """

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.lost: list[int] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.fed = False
        self._work: (
            tuple[ChunkQueue, Callable[[int], CopyOrder], Callable[[int, Copied | str], None]]
            | None
        ) = None
        self._wake = threading.Event()
        self._abort = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainyard-copy-helper", daemon=True)

    def start(self) -> Helper:
        self._thread.start()
        return self

    def feed(
        self,
        queue: ChunkQueue,
        order_of: Callable[[int], CopyOrder],
        on_chunk: Callable[[int, Copied | str], None],
    ) -> Helper:
        """Give the started worker its work (see the class)."""
        self._work, self.fed = (queue, order_of, on_chunk), True
        self._wake.set()
        return self

    def join(self) -> None:
        """Wait for the worker's last chunk (at most ``STALL_S``), then end the worker."""
        if self._thread.is_alive():
            self._thread.join()

    def abort(self) -> None:
        """Stop now: kill the worker, forget its chunk (nothing to redo: the caller failed or
        does not share)."""
        self._abort.set()
        if self._work is not None:
            self._work[0].stop()
        self._wake.set()
        self._kill()
        self.join()
        self._kill()  # spawned after the first kill: the thread closed it; reap it

    def _run(self) -> None:
        in_flight: deque[tuple[list[int], list[CopyOrder]]] = deque()
        stderr = tempfile.TemporaryFile()
        try:
            self.proc = _spawn(stderr)
            self._wake.wait()
            if self._work is not None:
                self._serve(self.proc, *self._work, in_flight)
            _close(self.proc)
        except Exception as exc:  # noqa: BLE001 - any failure: the caller does the rest
            self._kill()
            self._give_back(in_flight, f"{type(exc).__name__}: {exc}", stderr)
        finally:
            stderr.close()

    def _serve(
        self,
        proc: subprocess.Popen[bytes],
        queue: ChunkQueue,
        order_of: Callable[[int], CopyOrder],
        on_chunk: Callable[[int, Copied | str], None],
        in_flight: deque[tuple[list[int], list[CopyOrder]]],
    ) -> None:
        """Keep ``IN_FLIGHT`` chunks sent; answer the oldest as its answer comes. Raises
        WorkerLost (``in_flight`` then holds what was not answered)."""
        pending = bytearray()
        while True:
            while (
                len(in_flight) < IN_FLIGHT and not self._abort.is_set() and (chunk := queue.take())
            ):
                in_flight.append((chunk, [order_of(i) for i in chunk]))
                _send_orders(proc, in_flight[-1][1], time.monotonic() + STALL_S)
            if not in_flight:
                return
            answers = _answers(proc, len(in_flight[0][0]), time.monotonic() + STALL_S, pending)
            for index, answer in zip(in_flight[0][0], answers, strict=True):
                on_chunk(index, answer)
            in_flight.popleft()  # only now: a chunk whose answers failed midway is redone whole

    def _give_back(
        self, in_flight: deque[tuple[list[int], list[CopyOrder]]], why: str, stderr: IO[bytes]
    ) -> None:
        """The worker is dead: remove the temp files its chunks may have left (the names
        were chosen here), and hand the chunks back (``lost``) unless aborted."""
        chunk = [index for indices, _orders in in_flight for index in indices]
        for _indices, orders in in_flight:
            for order in orders:
                if order.temp is not None:
                    _remove(order.temp)
        if self._abort.is_set():
            return
        self.lost.extend(chunk)  # the caller's loop takes the chunks left; this worker is done
        stderr.seek(0)
        said = stderr.read()[-500:].decode(errors="replace").strip()
        self.log(
            f"copy helper process lost ({why}{'; it said: ' + said if said else ''}): "
            f"{len(chunk)} file(s) of its chunk and the rest done in this process"
        )

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait()


def _spawn(stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """The worker: a fresh interpreter (``-I``: no PYTHON* variables, no user site, no
    current folder on the path; ``-S``: no ``site``, 5 ms less) running
    ``localcopy.serve_stdio``, with only the folder of this process's ``blake3`` added to
    its path."""
    command = [sys.executable, "-I", "-S", "-c", _BOOT, localcopy.__file__, *_hash_paths()]
    proc = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, close_fds=True
    )
    for pipe in (proc.stdin, proc.stdout):
        try:
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]
        except (AttributeError, OSError):
            pass  # an older kernel, or a lower limit: a large chunk's write then waits
    return proc


def _hash_paths() -> list[str]:
    """The folder this process imports ``blake3`` from (none when it is not installed:
    the worker then reports blake3 copies failed and this process does them)."""
    try:
        import blake3
    except ImportError:
        return []
    return [os.path.dirname(os.path.dirname(os.path.abspath(blake3.__file__)))]


def _close(proc: subprocess.Popen[bytes]) -> None:
    """End of input: the worker exits; killed if it does not within ``STALL_S``."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(STALL_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _send_orders(proc: subprocess.Popen[bytes], orders: list[CopyOrder], deadline: float) -> None:
    """Send one chunk of orders. Raises WorkerLost."""
    assert proc.stdin is not None
    _send(proc.stdin.fileno(), localcopy.frame([f for o in orders for f in o.wire()]), deadline)


def _answers(
    proc: subprocess.Popen[bytes], count: int, deadline: float, pending: bytearray
) -> list[Copied | str]:
    """Read the answers to the oldest chunk sent (``count`` orders; ``pending``: as
    ``_receive``). Raises WorkerLost."""
    assert proc.stdout is not None
    return _parse(_receive(proc.stdout.fileno(), deadline, pending), count)


def _wait(fd: int, writing: bool, deadline: float) -> None:
    left = deadline - time.monotonic()
    ready = (
        select.select([], [fd], [], max(left, 0))
        if writing
        else select.select([fd], [], [], max(left, 0))
    )
    if not any(ready):
        raise WorkerLost(f"no answer in {STALL_S:.0f} s")


def _send(fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        _wait(fd, True, deadline)
        try:
            view = view[os.write(fd, view) :]
        except BrokenPipeError as exc:
            raise WorkerLost("it exited") from exc


def _receive(fd: int, deadline: float, pending: bytearray) -> bytes:
    """One whole frame (``localcopy.frame``) from the worker; ``pending`` holds what was
    read beyond it (the start of the next answer) for the next call. Raises WorkerLost."""
    while True:
        end = pending.find(b"\n")
        if end >= 0:
            header = bytes(pending[:end])
            if not header.isdigit():
                raise WorkerLost(f"not an answer: {bytes(pending[:80])!r}")
            size = end + 1 + int(header)
            if len(pending) >= size:
                data = bytes(pending[:size])
                del pending[:size]
                return data
        _wait(fd, False, deadline)
        part = os.read(fd, PIPE_BYTES)
        if not part:
            raise WorkerLost("it exited")
        pending += part


def _parse(data: bytes, count: int) -> list[Copied | str]:
    """The worker's answer (a whole frame) to a chunk of ``count`` orders. Raises
    WorkerLost."""
    header, _, payload = data.partition(b"\n")
    try:
        if not header.isdigit() or len(payload) != int(header):
            raise ValueError("bad frame")
        answers: list[Copied | str] = [
            Copied(int(size), value.decode()) if size else value.decode(errors="replace")
            for size, value in localcopy.unframe(payload, 2)
        ]
    except ValueError as exc:
        raise WorkerLost(f"not an answer: {data[:80]!r}") from exc
    if len(answers) != count:
        raise WorkerLost(f"{len(answers)} answers for {count} files")
    return answers


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
