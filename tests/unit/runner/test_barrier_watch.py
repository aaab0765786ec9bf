"""Issue 15, fifth pass: the gang barrier is released by the last task's ready mark (an
inotify watch on the rendezvous folder), not by the first task's next poll; the polls stay
as the fallback (a shared filesystem's mark from another node makes no local event)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from trainyard.runfile import Barrier
from trainyard.runner import barrier as barrier_mod
from trainyard.runner.barrier import mark_ready, wait_for_group


def _barrier(folder: Path, poll_interval_s: float = 5.0, timeout_s: float = 60) -> Barrier:
    return Barrier(
        enabled=True,
        folder=str(folder),
        tasks=["t1", "t2"],
        timeout_s=timeout_s,
        poll_interval_s=poll_interval_s,
    )


def _waited_s(barrier: Barrier, mark_after_s: float) -> float:
    folder = Path(str(barrier.folder))
    late = threading.Timer(mark_after_s, mark_ready, (folder, "t2", 0))
    late.start()
    started = time.monotonic()
    assert wait_for_group(barrier, "t1", 0)
    late.join()
    return time.monotonic() - started


def test_the_last_mark_wakes_the_waiting_task_without_a_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every poll 5 s apart: only the watch can let it pass within the second."""
    monkeypatch.setattr(barrier_mod, "FIRST_POLL_S", 5.0)
    monkeypatch.setattr(barrier_mod, "STOP_LOOK_S", 5.0)
    waited_s = _waited_s(_barrier(tmp_path / "rdv"), 0.2)
    assert 0.19 <= waited_s < 1.5, f"passed {waited_s:.2f}s after start (polls 5 s apart)"


def test_without_a_watch_the_polls_still_pass_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoWatch(barrier_mod._FolderWatch):
        def __init__(self, folder: Path) -> None:
            self.fd = None

    monkeypatch.setattr(barrier_mod, "_FolderWatch", NoWatch)
    waited_s = _waited_s(_barrier(tmp_path / "rdv", poll_interval_s=0.05), 0.2)
    assert 0.19 <= waited_s < 2.5


def test_a_folder_that_cannot_be_watched_gives_no_watch(tmp_path: Path) -> None:
    watch = barrier_mod._FolderWatch(tmp_path / "no-such-folder")
    assert watch.fd is None
    watch.wait(0.0, threading.Event())
    watch.close()


def test_stop_is_seen_while_the_watch_waits(tmp_path: Path) -> None:
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert wait_for_group(_barrier(tmp_path / "rdv", timeout_s=30), "t1", 0, stop) is False
    assert time.monotonic() - started < 5


def test_the_watch_descriptor_is_closed_after_the_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher hosts many runners in one process: none may leave a descriptor behind.
    (Closed on a thread of its own: closing an inotify instance waits ~15 ms in the kernel.)"""
    watched: list[int] = []
    closers: list[threading.Event] = []
    close = barrier_mod._FolderWatch.close

    def recorded(self: barrier_mod._FolderWatch) -> threading.Event | None:
        watched.append(self.fd if self.fd is not None else -1)
        closer = close(self)
        closers.extend([closer] if closer is not None else [])
        return closer

    monkeypatch.setattr(barrier_mod._FolderWatch, "close", recorded)
    assert _waited_s(_barrier(tmp_path / "rdv"), 0.1) >= 0.09  # waited, so it watched
    with pytest.raises(barrier_mod.BarrierTimeout):
        wait_for_group(_barrier(tmp_path / "rdv2", timeout_s=0.05), "t1", 0)
    assert len(closers) == 2 and min(watched) >= 0
    for closer in closers:
        assert closer.wait(timeout=30)
    for fd in watched:  # closed: gone, or its number reused by something else since
        try:
            assert os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:inotify"
        except FileNotFoundError:
            pass


def test_closing_the_watch_does_not_wait_for_the_kernel(tmp_path: Path) -> None:
    """The close returns before the descriptor is gone (the kernel's grace period runs on
    the closer thread), and the watch is left without a descriptor."""
    watch = barrier_mod._FolderWatch(tmp_path)
    assert watch.fd is not None
    fd = watch.fd
    closer = watch.close()
    assert watch.fd is None and closer is not None
    assert closer.wait(timeout=30)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed (no other descriptor is opened meanwhile in this test)
    assert watch.close() is None


def test_the_folder_is_not_looked_at_more_often_than_the_polls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large gang on a shared filesystem: the watch (which sees no other node's mark) must
    not turn the growing polls into a look every ``STOP_LOOK_S``. Polls 5 ms growing 1.5x to
    0.1 s: about 11 looks in 0.5 s (every 20 ms would be about 27)."""
    looks: list[float] = []
    missing = barrier_mod._missing

    def counted(folder: Path, tasks: list[str]) -> list[str]:
        looks.append(time.monotonic())
        return missing(folder, tasks)

    monkeypatch.setattr(barrier_mod, "_missing", counted)
    with pytest.raises(barrier_mod.BarrierTimeout):
        wait_for_group(_barrier(tmp_path / "rdv", poll_interval_s=0.1, timeout_s=0.5), "t1", 0)
    assert 3 <= len(looks) <= 16, len(looks)


def test_the_last_task_to_arrive_makes_no_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every mark already there (the last task of a gang, any one-task group): it passes
    without an inotify instance, whose making and closing (a thread, ~15 ms of the kernel's
    grace period) would be spent on nothing, once per task of a 1,000-group workflow."""
    made: list[Path] = []

    class Counted(barrier_mod._FolderWatch):
        def __init__(self, folder: Path) -> None:
            made.append(folder)
            super().__init__(folder)

    monkeypatch.setattr(barrier_mod, "_FolderWatch", Counted)
    mark_ready(tmp_path / "rdv", "t2", 0)
    assert wait_for_group(_barrier(tmp_path / "rdv"), "t1", 0)
    alone = Barrier(
        enabled=True,
        folder=str(tmp_path / "solo"),
        tasks=["only"],
        timeout_s=60,
        poll_interval_s=5.0,
    )
    assert wait_for_group(alone, "only", 0)
    assert made == []
    assert _waited_s(_barrier(tmp_path / "rdv3"), 0.1) >= 0.09
    assert made == [tmp_path / "rdv3"]  # one that waits still watches
