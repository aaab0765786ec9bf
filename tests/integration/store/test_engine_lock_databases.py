"""The one-engine-per-store lock (``acquire_store_lock``) with real processes, on SQLite (a
``flock`` beside the file) and on PostgreSQL (a session advisory lock): held for a process's
life, named by pid when refused, freed by ``kill -9`` even while a program it started
lives on; on PostgreSQL, a lock lost with its connection is noticed (the engine stops)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from trainyard.errors import EngineLockedError
from trainyard.store.lock import PgLock, acquire_store_lock

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
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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
    postgres_server: str,
) -> None:
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


def _end_sessions_of_this_process(admin: str, database: str) -> int:
    """What a database restart or a cut connection does to an engine's lock session:
    ``pg_terminate_backend`` on this process's trainyard-engine sessions; returns how many."""
    from sqlalchemy import create_engine, text

    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = :db AND application_name = :app"
                    ),
                    {
                        "db": database,
                        "app": f"trainyard-engine pid {os.getpid()} on {socket.gethostname()}"[:63],
                    },
                ).scalar()
            )
    finally:
        engine.dispose()


def test_a_lost_postgresql_lock_is_noticed_and_reported(postgres_server: str) -> None:
    from pg_support import fresh_database
    from sqlalchemy.engine import make_url

    for url in fresh_database(postgres_server):
        lost = threading.Event()
        reasons: list[str] = []

        def on_lost(reason: str) -> None:
            reasons.append(reason)  # noqa: B023 (called within this iteration only)
            lost.set()  # noqa: B023 (called within this iteration only)

        lock = acquire_store_lock(url, check_interval_s=0.2, on_lost=on_lost)
        assert isinstance(lock, PgLock) and lock.held()
        time.sleep(0.6)
        assert not lost.is_set()  # checks of a held lock report nothing
        assert _end_sessions_of_this_process(postgres_server, make_url(url).database) == 1
        assert lost.wait(10), "the lost lock was never noticed"
        assert "lost" in reasons[0] and len(reasons) == 1
        assert not lock.held()
        other = acquire_store_lock(url)  # another engine may take the store now
        assert other is not None
        other.release()
        lock.release()


def test_a_released_postgresql_lock_reports_no_loss(postgres_server: str) -> None:
    from pg_support import fresh_database

    for url in fresh_database(postgres_server):
        lost = threading.Event()
        lock = acquire_store_lock(url, check_interval_s=0.1, on_lost=lambda _r: lost.set())  # noqa: B023
        assert lock is not None
        lock.release()
        assert not lost.wait(0.5)
