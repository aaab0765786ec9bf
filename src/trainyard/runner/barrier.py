"""The gang barrier: every task of a group waits for all the others before its command runs.

Each task writes ``<folder>/<task>.ready`` (atomically: a temporary name, then a rename) and
polls the folder until every task of the group has a ready mark (soon at first, then less
often: ``FIRST_POLL_S``). Where Linux's inotify watches the folder, a mark renamed into it
wakes the waiting tasks at once (``_FolderWatch``: not a growing poll interval late), and the polls stay as
the fallback (a mark written on another node of a shared filesystem makes no local event), as
often as before (a large gang on a shared filesystem is not looked at more often).
The folder is on a
filesystem every task of the group sees (the local machine, or the cluster's shared
filesystem on Slurm). OSMO: "Groups" (tasks of a group start their commands together).
"""

from __future__ import annotations

import _thread
import json
import os
import select
import threading
import time
from pathlib import Path

from trainyard.linux.libc import libc as c_library
from trainyard.runfile import Barrier

__all__ = ["BarrierTimeout", "mark_ready", "wait_for_group", "FIRST_POLL_S"]

FIRST_POLL_S = 0.005
"""The first look at the folder comes this soon, then each wait is 1.5 times longer, up to
the barrier's ``poll_interval_s``: a gang started together passes within a few ms of its last
task's mark (instead of up to a whole ``poll_interval_s``), and a long wait still costs only a
look per ``poll_interval_s``."""


STOP_LOOK_S = 0.02
"""While a folder watch waits, the longest before ``stop`` is looked at again (a watch
cannot wait on a ``threading.Event``)."""

_IN_NONBLOCK = 0o4000  # inotify_init1 flags (linux/inotify.h)
_IN_CLOEXEC = 0o2000000
_IN_CREATE = 0x100  # inotify_add_watch events: a name made in, or moved into, the folder
_IN_MOVED_TO = 0x80


class _FolderWatch:
    """A descriptor that becomes readable when a name is created in, or renamed into,
    ``folder`` (inotify(7) through libc); ``fd`` is None where inotify cannot watch it
    (then the barrier only polls). Close it with ``close``."""

    def __init__(self, folder: Path) -> None:
        self.fd: int | None = None
        try:
            libc = c_library()
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        if fd < 0:
            return
        if libc.inotify_add_watch(fd, os.fsencode(folder), _IN_CREATE | _IN_MOVED_TO) < 0:
            os.close(fd)
            return
        self.fd = fd

    def wait(self, timeout_s: float, stop: threading.Event) -> None:
        """Return when a name appeared (events drained), ``stop`` is set (looked at every
        ``STOP_LOOK_S``), or after ``timeout_s``."""
        if self.fd is None:
            stop.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        while not stop.is_set() and (left_s := deadline - time.monotonic()) > 0:
            readable, _w, _x = select.select([self.fd], [], [], min(left_s, STOP_LOOK_S))
            if readable:
                try:
                    os.read(self.fd, 65536)
                except BlockingIOError:
                    pass
                return

    def close(self) -> threading.Event | None:
        """Close the descriptor on a thread of its own; the event returned is set once it
        is closed. The kernel waits for a grace period when an inotify instance is closed,
        13-18 ms measured here, which must not delay the command's start; and the thread is
        started without waiting for it to run (``threading.Thread.start`` does: in a
        launcher hosting runners, its other threads hold the GIL up to a switch interval)."""
        if self.fd is None:
            return None
        closed = threading.Event()
        _thread.start_new_thread(_close, (self.fd, closed))
        self.fd = None
        return closed


def _close(fd: int, closed: threading.Event) -> None:
    try:
        os.close(fd)
    finally:
        closed.set()


class BarrierTimeout(Exception):
    """Not every task of the group was ready in time; ``missing`` names those absent."""

    def __init__(self, missing: list[str], timeout_s: float) -> None:
        self.missing = missing
        super().__init__(f"barrier: no ready mark from {', '.join(missing)} after {timeout_s:g}s")


def mark_ready(folder: Path, task: str, retry_id: int) -> Path:
    """Write this task's ready mark and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    mark = folder / f"{task}.ready"
    partial = folder / f".{task}.ready.{os.getpid()}"
    partial.write_text(json.dumps({"task": task, "retry_id": retry_id, "time_s": time.time()}))
    partial.replace(mark)
    return mark


def _missing(folder: Path, tasks: list[str]) -> list[str]:
    return [t for t in tasks if not (folder / f"{t}.ready").exists()]


def wait_for_group(
    barrier: Barrier, task: str, retry_id: int, stop: threading.Event | None = None
) -> bool:
    """Mark ``task`` ready and wait until every task of ``barrier.tasks`` is.

    Returns:
        True when all are ready; False when ``stop`` was set while waiting.

    Raises:
        BarrierTimeout: ``barrier.timeout_s`` passed first.
    """
    folder = Path(str(barrier.folder))
    mark_ready(folder, task, retry_id)
    if not _missing(folder, barrier.tasks):
        return True  # the last to arrive (every one-task group): no watch to make and close
    watch = _FolderWatch(folder)  # _wait looks again first: a mark made before it is seen
    try:
        return _wait(barrier, folder, watch, stop or threading.Event())
    finally:
        watch.close()


def _wait(barrier: Barrier, folder: Path, watch: _FolderWatch, stop: threading.Event) -> bool:
    """``wait_for_group``'s loop: look, then wait for a mark (``watch``) or the next poll."""
    deadline = time.monotonic() + barrier.timeout_s
    interval_s = min(FIRST_POLL_S, barrier.poll_interval_s)
    while missing := _missing(folder, barrier.tasks):
        if time.monotonic() >= deadline:
            raise BarrierTimeout(missing, barrier.timeout_s)
        watch.wait(interval_s, stop)  # the folder is looked at again on a mark, or a poll
        if stop.is_set():
            return False
        interval_s = min(interval_s * 1.5, barrier.poll_interval_s)
    return True
