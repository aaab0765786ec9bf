"""``backends.local.wakeup.FactsSocket`` and ``runner.report.notify_socket``: the datagram a runner
sends after each event wakes the engine (issue 15). Real Unix sockets in a temporary folder."""

from __future__ import annotations

import os
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.backends.local.wakeup import MAX_SOCKET_PATH_BYTES, FactsSocket
from trainyard.runner.report import EventWriter, notify_socket, read_events

WAIT_S = 10.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a Unix socket path has at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ty-"))
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


def test_each_datagram_calls_wake_and_close_removes_the_socket(short_dir: Path) -> None:
    woken = threading.Semaphore(0)
    facts = FactsSocket(short_dir / "f.sock", woken.release)
    assert stat.S_IMODE(os.stat(facts.path).st_mode) == 0o600
    for _ in range(3):
        assert notify_socket(facts.path)
        assert woken.acquire(timeout=WAIT_S)
    facts.close()
    facts.close()  # idempotent
    assert not Path(facts.path).exists()
    assert notify_socket(facts.path) is False  # gone: no error for the runner


def test_an_event_writer_notifies_after_the_line_is_written(short_dir: Path) -> None:
    lines: list[int] = []
    done = threading.Event()
    events = short_dir / "events.jsonl"

    def wake() -> None:
        lines.append(len(read_events(events)[0]))
        done.set()

    facts = FactsSocket(short_dir / "f.sock", wake)
    try:
        EventWriter(short_dir, notify=facts.path).emit("RUNNING")
        assert done.wait(WAIT_S)
        assert lines == [1]  # the reader woken finds the event it was woken for
    finally:
        facts.close()


def test_a_newer_socket_at_the_same_path_outlives_the_older_ones_close(short_dir: Path) -> None:
    old = FactsSocket(short_dir / "f.sock", lambda: None)
    woken = threading.Event()
    new = FactsSocket(short_dir / "f.sock", woken.set)  # a new engine's backend, same home
    old.close()
    try:
        assert Path(new.path).exists()
        assert notify_socket(new.path) and woken.wait(WAIT_S)
    finally:
        new.close()


def test_a_path_too_long_for_a_socket_is_refused_before_binding(short_dir: Path) -> None:
    long_path = short_dir / ("x" * MAX_SOCKET_PATH_BYTES)
    with pytest.raises(OSError, match="longer than"):
        FactsSocket(long_path, lambda: None)
    assert not long_path.exists()


def test_notify_socket_never_raises_for_a_path_that_is_no_socket(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    assert notify_socket(str(plain)) is False
    assert notify_socket(str(tmp_path / "missing")) is False
