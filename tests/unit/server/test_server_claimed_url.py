"""``server.process.claimed_url``: the lock holder's address with only the cheap checks (the
lock held, a URL in the note, written on this host, its pid alive), never psutil (issue 15).
A real lock on a real file: ``flock`` is per open file, so a lock taken in this process is
seen by the peek as another holder's."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainyard.server.process import claimed_url, lock_path
from trainyard.store.lock import FileLock

URL = "http://127.0.0.1:41234"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[FileLock]:
    lock = FileLock.acquire(lock_path(tmp_path), what="the test home")
    yield lock
    lock.release()


def _note(lock: FileLock, **fields: Any) -> None:
    lock.note(
        {
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "url": URL,
            "create_time_s": 0.0,
            **fields,
        }
    )


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_address_of_a_live_holder_on_this_host(tmp_path: Path, held: FileLock) -> None:
    _note(held)
    assert claimed_url(tmp_path) == URL


def test_no_address_without_a_holder(tmp_path: Path) -> None:
    assert claimed_url(tmp_path) is None  # no lock file
    lock = FileLock.acquire(lock_path(tmp_path), what="the test home")
    _note(lock)
    lock.release()
    assert claimed_url(tmp_path) is None  # a note, but nobody holds the lock


def test_no_address_from_a_holder_still_starting(tmp_path: Path, held: FileLock) -> None:
    assert claimed_url(tmp_path) is None  # the note FileLock writes: pid and host only


@pytest.mark.parametrize(
    "fields", [{"host": "another-host"}, {"pid": "12"}, {"pid": 0}, {"url": ""}, {"url": None}]
)
def test_no_address_from_a_note_it_cannot_check(
    tmp_path: Path, held: FileLock, fields: dict[str, Any]
) -> None:
    _note(held, **fields)
    assert claimed_url(tmp_path) is None


def test_no_address_when_the_notes_pid_is_dead(tmp_path: Path, held: FileLock) -> None:
    _note(held, pid=_dead_pid())  # a dead server's note, its successor not yet rewriting it
    assert claimed_url(tmp_path) is None
