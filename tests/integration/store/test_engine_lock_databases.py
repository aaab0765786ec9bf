"""The one-engine-per-store lock (``acquire_store_lock``) with real processes, on SQLite (a
``flock`` beside the file) and on PostgreSQL (a session advisory lock): held for a process's
life, named by pid when refused, freed by ``kill -9`` even while a program it started
lives on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from trainyard.errors import EngineLockedError
from trainyard.store.lock import acquire_store_lock

HOLD = """
import subprocess, sys, time
from trainyard.store.lock import acquire_store_lock
lock = acquire_store_lock(sys.argv[1])
child = subprocess.Popen(["sleep", "300"])  # a program it starts must not inherit the lock
print(child.pid, flush=True)
time.sleep(300)
"""


def _hold(url: str) -> tuple[subprocess.Popen[str], int]:
    """A process holding the engine lock of ``url``, and the pid of a program it started."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line, proc.stderr.read()  # type: ignore[union-attr]
    return proc, int(line)


def test_the_lock_is_held_for_life_named_and_freed_by_kill_9(store_url: str) -> None:
    proc, child = _hold(store_url)
    try:
        with pytest.raises(EngineLockedError, match=f"pid {proc.pid}"):
            acquire_store_lock(store_url, wait_s=0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        mine = acquire_store_lock(store_url, wait_s=5.0)  # its child still runs
        assert mine is not None
        with pytest.raises(EngineLockedError):
            acquire_store_lock(store_url)  # held by this process now, and not shared
        mine.release()
        again = acquire_store_lock(store_url)
        assert again is not None
        again.release()
    finally:
        os.kill(child, signal.SIGKILL)
        proc.kill()


def test_engines_on_two_databases_of_one_server_do_not_block_each_other(
        postgres_server: str) -> None:
    from pg_support import fresh_database

    for first in fresh_database(postgres_server):
        for second in fresh_database(postgres_server):
            one = acquire_store_lock(first)
            two = acquire_store_lock(second)
            assert one is not None and two is not None
            with pytest.raises(EngineLockedError, match=f"pid {os.getpid()}"):
                acquire_store_lock(second)
            one.release()
            two.release()
