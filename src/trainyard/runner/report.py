"""What the runner writes for the world to read: ``events.jsonl`` and ``task.log``.

``<run_dir>/events.jsonl``: one JSON object per line, appended and flushed as it happens::

    {"kind": "INITIALIZING" | "RUNNING" | "EXITED", "time_s": 1700000000.0,
     "exit_code": null | int, "message": ""}

``<run_dir>/task.log``: the command's stdout and stderr, line by line, in OSMO's log format
``YYYY/MM/DD HH:MM:SS [task] text`` (UTC); the runner's own lines are tagged
``[task][trainyard]``. The file belongs to one attempt (run_dir is per retry id) and its first
runner line names the retry id.

Backends read events with ``read_events`` so that every backend parses them the same way.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["Event", "EventWriter", "TaskLog", "read_events", "format_line", "EVENTS", "LOG"]

EVENTS = "events.jsonl"
LOG = "task.log"


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``."""

    kind: str
    time_s: float
    exit_code: int | None = None
    message: str = ""


class EventWriter:
    """Appends events to ``<run_dir>/events.jsonl``; each line is flushed (readers see it at
    once), and EXITED is fsynced too (the one a machine crash must not take back)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / EVENTS
        self._lock = threading.Lock()

    def emit(self, kind: str, exit_code: int | None = None, message: str = "") -> Event:
        """Append one event stamped now and return it."""
        event = Event(kind, time.time(), exit_code, message)
        line = json.dumps(event.__dict__) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            if kind == "EXITED":
                os.fsync(handle.fileno())
        return event


def _parse_event(line: bytes) -> Event | None:
    try:
        data = json.loads(line)
        return Event(str(data["kind"]), float(data["time_s"]), data.get("exit_code"),
                     str(data.get("message") or ""))
    except (ValueError, KeyError, TypeError):
        return None


def read_events(path: Path, offset: int = 0) -> tuple[list[Event], int]:
    """Complete events written after byte ``offset``.

    Returns:
        (events, new offset). A partly written last line is left for the next call; lines
        that are not valid events are skipped. A missing file gives ``([], offset)``.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    events = [e for e in map(_parse_event, complete.splitlines()) if e is not None]
    return events, offset + len(complete)


def format_line(tag: str, text: str, when: float | None = None) -> str:
    """One log line in OSMO's format: ``YYYY/MM/DD HH:MM:SS [tag] text`` (UTC, no newline)."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(time.time() if when is None else when))
    return f"{stamp} [{tag}] {text}"


class TaskLog:
    """Thread-safe writer of ``<run_dir>/task.log``; each line is flushed as written."""

    def __init__(self, run_dir: Path, task: str, echo: IO[str] | None = None) -> None:
        self.path = Path(run_dir) / LOG
        self.task = task
        self._echo = echo
        self._lock = threading.Lock()
        self._handle = open(self.path, "a", encoding="utf-8", errors="replace")

    def command(self, text: str) -> None:
        """Log one line the user's command printed."""
        self._write(self.task, text)

    def runner(self, text: str) -> None:
        """Log one line of the runner's own (tag ``[task][trainyard]``)."""
        self._write(f"{self.task}][trainyard", text)

    def _write(self, tag: str, text: str) -> None:
        line = format_line(tag, text.rstrip("\r\n")) + "\n"
        with self._lock:
            self._handle.write(line)
            self._handle.flush()
            if self._echo is not None:
                self._echo.write(line)
                self._echo.flush()

    def close(self) -> None:
        """Close the file; later writes are errors."""
        with self._lock:
            self._handle.close()
