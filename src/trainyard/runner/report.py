r"""What the runner writes for the world to read: ``events.jsonl`` and ``task.log``.

``<run_dir>/events.jsonl``: one JSON object per line, appended and flushed as it happens:
``{"kind": "INITIALIZING" | "RUNNING" | "EXITED", "time_s": float, "exit_code": null | int,
"message": str}``; backends read it with ``read_events``. ``<run_dir>/task.log``: one attempt's
output in OSMO's log format ``YYYY/MM/DD HH:MM:SS [task] text`` (UTC), tags ``[task]``,
``[task][cut]`` (pieces of ``MAX_LINE_BYTES``), ``[task][trainyard]``, ``[task][detail]``;
control characters escaped (``escape_control``); the server reads it with ``parse_line``. A log
write that fails (ENOSPC) ends the attempt with ``LOG_FAILED_EXIT_CODE`` (``RESERVE_BYTES``
keep room for the last lines). With ``FACTS_SOCKET_ENV`` set, each event is also a datagram
(best effort). Tags, escapes and disk-full rules: docs/logs.md, "The runner's files".
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from trainyard.status import ExitCode

__all__ = [
    "Event",
    "EventWriter",
    "notify_socket",
    "FACTS_SOCKET_ENV",
    "TaskLog",
    "read_events",
    "format_line",
    "escape_control",
    "parse_line",
    "LogParts",
    "reserve_space",
    "EVENTS",
    "LOG",
    "RESERVE",
    "MAX_LINE_BYTES",
    "RESERVE_BYTES",
    "LOG_FAILED_EXIT_CODE",
    "RUNNER_TAG",
    "CUT_TAG",
    "DETAIL_TAG",
    "is_detail_line",
]

EVENTS = "events.jsonl"
FACTS_SOCKET_ENV = "TRAINYARD_FACTS_SOCKET"
"""The runner's environment variable naming the socket that hears of new events (a task's
environment never gets it: it holds no ``TRAINYARD_*`` of its runner's)."""
LOG = "task.log"
RESERVE = "log.reserve"
"""Disk space the runner keeps for its last lines and EXITED event (see ``reserve_space``)."""

MAX_LINE_BYTES = 64 * 1024
"""The longest piece of a command's output line the runner writes as one log line (bytes of
output, before escaping); a longer line becomes several ``[cut]`` pieces."""
RESERVE_BYTES = 16 * 1024
LOG_FAILED_EXIT_CODE = int(ExitCode.SERVICE_MESSAGES_FAILED)
"""The exit code of an attempt whose task log could not be written (disk full)."""
RUNNER_TAG = "trainyard"
CUT_TAG = "cut"
DETAIL_TAG = "detail"


@dataclass(frozen=True)
class Event:
    """One line of ``events.jsonl``."""

    kind: str
    time_s: float
    exit_code: int | None = None
    message: str = ""
    failure: str | None = None
    """With EXITED: a kind of failure (``IMAGE_PULL``), else None (not written)."""


class EventWriter:
    """Appends events to ``<run_dir>/events.jsonl``; each line is flushed (readers see it at
    once), and EXITED is fsynced too (the one a machine crash must not take back).

    Args:
        run_dir: the attempt's run folder.
        notify: a Unix datagram socket's path that gets one datagram after each event
            (``notify_socket``); None: none.
    """

    def __init__(self, run_dir: Path, notify: str | None = None) -> None:
        self.path = Path(run_dir) / EVENTS
        self.notify = notify
        self._lock = threading.Lock()

    def emit(
        self, kind: str, exit_code: int | None = None, message: str = "", failure: str | None = None
    ) -> Event:
        """Append one event stamped now and return it."""
        event = Event(kind, time.time(), exit_code, message, failure)
        fields = {k: v for k, v in event.__dict__.items() if k != "failure" or v is not None}
        line = json.dumps(fields) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            if kind == "EXITED":
                os.fsync(handle.fileno())
        if self.notify:
            notify_socket(self.notify)
        return event


def notify_socket(path: str) -> bool:
    """Send one datagram to the Unix datagram socket at ``path`` without blocking.

    Returns:
        Whether it was sent. Never raises: a socket that is gone, refuses, or whose queue is
        full (its reader is woken already) is no error, since the datagram only says "look".
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(b"!", path)
        return True
    except OSError:
        return False


def _parse_event(line: bytes) -> Event | None:
    try:
        data = json.loads(line)
        failure = data.get("failure")
        return Event(
            str(data["kind"]),
            float(data["time_s"]),
            data.get("exit_code"),
            str(data.get("message") or ""),
            str(failure) if failure else None,
        )
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


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""What ``escape_control`` escapes: C0 and C1 control characters but tab (so CR, LF, ESC,
backspace, NUL), DEL, the Unicode line and paragraph separators, and the bidirectional
embedding, override and isolate controls (which reorder how a terminal shows the text)."""
_NAMED = {"\r": "\\r", "\n": "\\n"}


def _escaped(match: re.Match[str]) -> str:
    char = match.group(0)
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_control(text: str) -> str:
    """``text`` with every control character written as an escape: ``\\r``, ``\\n``,
    ``\\xNN`` (ESC is ``\\x1b``) or ``\\uNNNN`` (see ``_CONTROL``). Tabs and backslashes
    are kept, so escaping twice changes nothing."""
    if _CONTROL.search(text) is None:
        return text
    return _CONTROL.sub(_escaped, text)


@dataclass(frozen=True)
class LogParts:
    """One ``task.log`` line taken apart (``parse_line``)."""

    stamp: str | None
    """``YYYY/MM/DD HH:MM:SS`` (UTC), or None when the line is not in OSMO's format."""
    source: str
    """``runner`` for the runner's own lines, ``detail`` for its isolation detail, ``task``
    for the command's output."""
    cut: bool
    """A piece of a longer line; the next line of the attempt continues it."""
    text: str
    """The text after the time and tag; runner lines keep ``[trainyard] `` before it."""


_STAMP = re.compile(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[")


def parse_line(line: str, task: str) -> LogParts:
    """Take apart a line of ``task``'s log (no newline): its time, who wrote it, whether it
    was cut, its text. A line in no known shape is task output with no time."""
    if _STAMP.match(line) is None:
        return LogParts(None, "task", False, line)
    stamp, rest = line[:19], line[20:]
    tag = f"[{task}]"
    if not rest.startswith(tag):
        return LogParts(stamp, "task", False, rest)
    rest = rest[len(tag) :]
    if rest.startswith(f"[{RUNNER_TAG}] "):
        return LogParts(stamp, "runner", False, rest)
    if rest.startswith(f"[{CUT_TAG}] "):
        return LogParts(stamp, "task", True, rest[len(CUT_TAG) + 3 :])
    if rest.startswith(f"[{DETAIL_TAG}] "):
        return LogParts(stamp, "detail", False, rest)
    return LogParts(stamp, "task", False, rest.removeprefix(" "))


def is_detail_line(line: bytes, task: str) -> bool:
    """Whether ``line`` (raw bytes of ``task``'s log) is a ``[task][detail]`` line: cheap
    enough for every line a log reader reads (no decoding, no parsing)."""
    return line[20:].startswith(f"[{task}][{DETAIL_TAG}] ".encode())


def reserve_space(run_dir: Path) -> Path | None:
    """Set ``RESERVE_BYTES`` of disk aside in ``run_dir/log.reserve`` (allocated, not
    sparse); deleting the file gives the space back for the runner's last words. None when
    the space cannot be had (the disk is already full): the runner runs without a reserve."""
    path = Path(run_dir) / RESERVE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError:
        path.unlink(missing_ok=True)
        return None
    finally:
        os.close(fd)
    return path


class TaskLog:
    """Thread-safe writer of ``<run_dir>/task.log``: one ``write`` per line, nothing held.

    Args:
        run_dir: the attempt's folder.
        task: the task's name (the tag).
        echo: a stream that gets a copy of every line written.
        on_failure: called once, with the error, when a line cannot be written; the command's
            later lines are then dropped (``dropped_lines`` counts them), the runner's own
            are still tried.
    """

    def __init__(
        self,
        run_dir: Path,
        task: str,
        echo: IO[str] | None = None,
        on_failure: Callable[[OSError], None] | None = None,
    ) -> None:
        self.path = Path(run_dir) / LOG
        self.task = task
        self.on_failure = on_failure
        self.failure: OSError | None = None
        self.dropped_lines = 0
        self._echo = echo
        self._lock = threading.Lock()
        self._torn = False  # the file ends in a partly written line
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        self.secrets: tuple[str, ...] = ()
        """Literal values masked as ``***`` in the runner's own lines (the task's
        credentials): a runner message never shows one, whatever error text it carries."""

    def command(self, text: str, cut: bool = False) -> None:
        """Log one line the user's command printed (its newline, or CR LF, removed), or with
        ``cut`` one piece of a longer line (kept as it is, tagged ``[task][cut]``)."""
        if self.failure is not None:
            self.dropped_lines += 1
            return
        if cut:
            self._write(f"{self.task}][{CUT_TAG}", text)
        else:
            self._write(self.task, text.rstrip("\r\n"))

    def runner(self, text: str) -> None:
        """Log one line of the runner's own (tag ``[task][trainyard]``), ``secrets`` masked."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        self._write(f"{self.task}][{RUNNER_TAG}", text.rstrip("\r\n"))

    def detail(self, text: str) -> None:
        """Log one line of isolation detail (tag ``[task][detail]``), ``secrets`` masked."""
        for secret in self.secrets:
            text = text.replace(secret, "***")
        self._write(f"{self.task}][{DETAIL_TAG}", text.rstrip("\r\n"))

    def _write(self, tag: str, text: str) -> None:
        line = format_line(tag, escape_control(text)) + "\n"
        with self._lock:
            if self._fd is None:
                raise ValueError(f"task log {self.path} is closed")
            try:
                self._write_all(line.encode("utf-8", errors="replace"))
            except OSError as exc:
                first = self.failure is None
                self.failure = self.failure or exc
            else:
                first = False
                if self._echo is not None:
                    self._echo.write(line)
                    self._echo.flush()
        if first and self.on_failure is not None and self.failure is not None:
            self.on_failure(self.failure)

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        if self._torn:
            data = b"\n" + data
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except OSError:
                self._take_back(len(data) - len(view))
                raise
        self._torn = False

    def _take_back(self, written: int) -> None:
        """A write failed after ``written`` bytes of a line: cut them off the file's end so
        that no fragment of a line (a bare ``2026/``) stays; if that fails too, the next line
        starts with a newline (``_torn``)."""
        if not written:
            return
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
        except OSError:
            self._torn = True

    def close(self) -> None:
        """Close the file; later writes are errors."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
