"""The one-engine lock (``store.lock``) with real processes: held for a process's life,
named by pid when refused, freed by ``kill -9``, never inherited by a started program."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard.errors import EngineLockedError, StoreError
from trainyard.store.lock import FileLock, acquire_store_lock, holder, store_lock_path

HOLD = """
import sys, time, subprocess
from pathlib import Path
from trainyard.store.lock import FileLock
lock = FileLock.acquire(Path(sys.argv[1]), what="the test store")
child = subprocess.Popen(["sleep", "300"])  # a program it starts must not inherit the lock
print(child.pid, flush=True)
time.sleep(300)
"""


def hold(path: Path) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    child = int(proc.stdout.readline())  # type: ignore[union-attr]
    return proc, child


def test_the_lock_is_held_for_life_named_and_freed_by_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "trainyard.db.lock"
    assert holder(path) is None
    proc, child = hold(path)
    try:
        assert holder(path) == {"pid": proc.pid, "host": os.uname().nodename}
        with pytest.raises(EngineLockedError, match=f"pid {proc.pid}"):
            FileLock.acquire(path, what="the test store", wait_s=0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert holder(path) is None  # its child still runs, yet holds nothing
        mine = FileLock.acquire(path, what="the test store")
        assert holder(path)["pid"] == os.getpid()  # flock is per open file: seen here too
        mine.release()
    finally:
        os.kill(child, signal.SIGKILL)
        proc.kill()


def test_a_peek_never_keeps_a_starting_holder_out(tmp_path: Path) -> None:
    path = tmp_path / "server.lock"
    path.touch()
    deadline = time.monotonic() + 1.0
    lock = None
    while time.monotonic() < deadline and lock is None:
        holder(path)  # what a CLI does while a server starts
        lock = FileLock.acquire(path, what="x", wait_s=1.0)
    assert lock is not None
    lock.release()


def test_store_lock_paths() -> None:
    assert store_lock_path("sqlite:////x/y/trainyard.db") == Path("/x/y/trainyard.db.lock")
    assert store_lock_path("sqlite://") is None
    assert store_lock_path("sqlite:///:memory:") is None
    assert store_lock_path("postgresql+psycopg://u@h/db") is None
    assert acquire_store_lock("sqlite://") is None


def test_a_store_reached_through_a_symlinked_path_is_locked(tmp_path: Path) -> None:
    """Issue 24: ``sqlite:///link.db`` (a link to ``real.db``) took ``link.db.lock`` while
    another engine held ``real.db.lock``: two engines drove one store."""
    real = tmp_path / "real" / "trainyard.db"
    real.parent.mkdir()
    real.touch()
    (tmp_path / "link.db").symlink_to(real)
    (tmp_path / "linked").symlink_to(real.parent)
    first = acquire_store_lock(f"sqlite:///{real}")
    try:
        for other in (tmp_path / "link.db", tmp_path / "linked" / "trainyard.db"):
            with pytest.raises(EngineLockedError, match=f"pid {os.getpid()}"):
                acquire_store_lock(f"sqlite:///{other}")
    finally:
        assert first is not None
        first.release()


def test_a_lock_file_planted_as_a_symlink_is_never_written_through(tmp_path: Path) -> None:
    """Issue 24: a link planted where the lock lives (``trainyard.db.lock -> victim``) made
    the engine truncate the victim and write its note there, as the server's user."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    lock = tmp_path / "trainyard.db.lock"
    lock.symlink_to(victim)
    (tmp_path / "trainyard.db").touch()
    with pytest.raises(StoreError, match="lock file .* is a symbolic link"):
        acquire_store_lock(f"sqlite:///{tmp_path / 'trainyard.db'}")
    with pytest.raises(StoreError, match="symbolic link"):
        FileLock.acquire(lock, what="x")
    assert victim.read_text() == "precious\n"
    assert holder(lock) is None
    fifo = tmp_path / "server.lock"
    os.mkfifo(fifo)
    with pytest.raises(StoreError, match="not a regular file"):
        FileLock.acquire(fifo, what="x")
