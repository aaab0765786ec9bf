"""Reading task logs for the API with bounded memory: from file offsets, lazily, merged by time.

At once it holds, whatever the logs' size, per attempt's ``task.log`` a batch of at most
``BATCH_BYTES`` shared among the files (at least ``MIN_BATCH_BYTES`` each) plus one line of at
most ``MAX_READ_LINE_BYTES`` (longer: cut, ``[... N more bytes of this line not shown]``); a file
is open only while a batch is read. ``last_lines`` finds the last N lines by reading backwards
(``tail_offset``). Control characters are escaped again (``escape_control``). Follow mode reads
only complete lines and keeps each file's offset between polls. docs/logs.md, "Limits".
"""

from __future__ import annotations

import functools
import heapq
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainyard.runner.report import (
    DETAIL_TAG,
    MAX_LINE_BYTES,
    escape_control,
    is_detail_line,
    parse_line,
)

__all__ = [
    "LogLine",
    "LogFile",
    "FLUSH",
    "read_merged",
    "tail_offset",
    "file_size",
    "read_detail",
    "DETAIL_READ_BYTES",
    "MAX_READ_LINE_BYTES",
    "BATCH_BYTES",
    "MIN_BATCH_BYTES",
]

MAX_READ_LINE_BYTES = 4 * MAX_LINE_BYTES + 1024
"""The longest line served as it is; the time, tag and a 64 KiB piece the runner escaped."""
BATCH_BYTES = 1 << 20
"""Bytes of lines read ahead for all files of one request together."""
MIN_BATCH_BYTES = 8 * 1024
TAIL_BLOCK_BYTES = 64 * 1024
FLUSH = None
"""Yielded by a follow stream before it waits: whatever is batched should go out now."""


@dataclass(frozen=True)
class LogLine:
    """One line of a task's log: its task, attempt and OSMO-format text
    (``YYYY/MM/DD HH:MM:SS [task] text``, UTC), control characters escaped."""

    task: str
    retry_id: int
    text: str
    span: tuple[int, int] | None = field(default=None, compare=False, repr=False)
    """Where the line lies in its attempt's ``task.log``: ``(start, end)`` byte offsets
    (None where unknown). A follow that joins a shared reader (``streams.LogFeed``) skips
    the lines it already had by these."""

    @property
    def stamp(self) -> str:
        """The line's ``YYYY/MM/DD HH:MM:SS`` prefix (sorts by time)."""
        return self.text[:19]

    def to_json(self) -> dict[str, Any]:
        """``{"time": ISO 8601 UTC or None, "task", "retry_id", "line", "source", "cut"}``:
        ``line`` is the text after the time and the ``[task]`` tag (runner lines keep
        ``[trainyard]``, a cut piece loses its ``[cut]``); ``source`` is ``runner`` for the
        runner's own lines and ``task`` for the command's output, which cannot set it;
        ``cut``: a piece of a longer line that the next line of the attempt continues. A
        line in no known shape is ``task`` output with ``time`` None and all its text."""
        parts = parse_line(self.text, self.task)
        when = _iso(parts.stamp)
        if when is None:
            return {
                "time": None,
                "task": self.task,
                "retry_id": self.retry_id,
                "line": self.text,
                "source": "task",
                "cut": False,
            }
        return {
            "time": when,
            "task": self.task,
            "retry_id": self.retry_id,
            "line": parts.text,
            "source": parts.source,
            "cut": parts.cut,
        }


@functools.lru_cache(maxsize=4096)
def _iso(stamp: str | None) -> str | None:
    """``YYYY/MM/DD HH:MM:SS`` as ISO 8601 UTC; None when it is no time. Cached: the lines
    of a log share few stamps, and ``strptime`` was most of the cost of ``--format-type json``."""
    if stamp is None:
        return None
    try:
        return datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S").replace(tzinfo=UTC).isoformat()
    except ValueError:
        return None


@dataclass
class LogFile:
    """One attempt's ``task.log`` and how far it has been read (``offset``)."""

    task: str
    retry_id: int
    path: Path
    offset: int = 0
    hide_detail: bool = False
    """Leave out the runner's ``[task][detail]`` lines (the isolation detail)."""
    skipping: bool = False
    """In the middle of a line too long to show: the rest up to its newline is skipped."""
    _skipped: int = field(default=0, repr=False)
    _head: bytes = field(default=b"", repr=False)
    _start: int = field(default=0, repr=False)

    def batch(self, end: int, budget_bytes: int, follow: bool) -> list[LogLine]:
        """The lines from ``offset`` up to byte ``end``: at least one when there is one,
        then more until ``budget_bytes``; ``offset`` advances past them. A last line without
        newline before ``end`` is a line; with ``follow`` it waits for its newline.

        Raises:
            FileNotFoundError: the file is gone.
        """
        lines: list[LogLine] = []
        if self.offset >= end:
            return lines
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            used = 0
            while self.offset < end and (not lines or used < budget_bytes):
                raw = handle.readline(min(MAX_READ_LINE_BYTES, end - self.offset))
                if not raw or (
                    follow
                    and not self.skipping
                    and not raw.endswith(b"\n")
                    and len(raw) < MAX_READ_LINE_BYTES
                ):
                    break  # the file is shorter than end, or a line is still being written
                if not self.skipping:
                    self._start = self.offset
                self.offset += len(raw)
                used += len(raw)
                line = self._take(raw)
                if line is not None:
                    lines.append(line)
        if self.skipping and not follow and self.offset >= end:
            lines.append(self._shortened())
        return lines

    def _take(self, raw: bytes) -> LogLine | None:
        """The line that ``raw`` (just read) ends, if any."""
        complete = raw.endswith(b"\n")
        if self.skipping:
            self._skipped += len(raw) - complete
            return self._shortened() if complete else None
        if complete or len(raw) < MAX_READ_LINE_BYTES:
            if self.hide_detail and is_detail_line(raw, self.task):
                return None
            text = raw.removesuffix(b"\n").decode("utf-8", errors="replace")
            return LogLine(
                self.task, self.retry_id, escape_control(text), (self._start, self.offset)
            )
        self.skipping, self._skipped, self._head = True, 0, raw
        return None

    def _shortened(self) -> LogLine:
        """The start of a line too long to show, with how much of it was left out."""
        text = escape_control(self._head.decode("utf-8", errors="replace"))
        self.skipping, self._head = False, b""
        return LogLine(
            self.task,
            self.retry_id,
            f"{text} [... {self._skipped} more bytes of this line not shown]",
            (self._start, self.offset),
        )


def tail_offset(
    path: Path,
    end: int,
    count: int,
    *,
    complete_only: bool = False,
    hide_task: str | None = None,
) -> tuple[int, int]:
    """Where the last ``count`` lines before byte ``end`` of ``path`` start, found by
    reading backwards from ``end`` in blocks.

    Args:
        path: the file (missing: no lines).
        end: where the lines end (the file's size when they were counted).
        count: how many lines.
        complete_only: bytes after the last newline are no line (follow mode), instead of
            a last line without newline.
        hide_task: the task whose ``[task][detail]`` lines a reader hides (``LogFile``'s
            ``hide_detail``): they do not count toward ``count`` (``logs -n N`` shows N
            lines). None: every line counts.

    Returns:
        ``(offset, lines)``: the byte offset where they start and how many lines (at most
        ``count``, hidden ones not counted) lie between it and ``end``.
    """
    if end <= 0 or count <= 0:
        return end, 0
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        return end, 0
    with handle:
        return _TailScan(handle, end, count, complete_only, hide_task).run()


class _TailScan:
    """The backward scan of ``tail_offset``: counts the lines that start after each
    newline found, from the end of the file to its start."""

    def __init__(
        self, handle: Any, end: int, count: int, complete_only: bool, hide_task: str | None
    ) -> None:
        self.handle, self.end, self.count = handle, end, count
        self.complete_only, self.hide_task = complete_only, hide_task
        self.head_bytes = 20 + len(f"[{hide_task}][{DETAIL_TAG}] ".encode()) if hide_task else 0
        self.shown = 0

    def run(self) -> tuple[int, int]:
        """``(offset, lines)`` as ``tail_offset`` returns them."""
        pos, past_last_end = self.end, None
        while pos > 0:
            start = max(0, pos - TAIL_BLOCK_BYTES)
            self.handle.seek(start)
            block = self.handle.read(pos - start)
            index = len(block)
            if past_last_end is None:
                # a last line without newline is a line unless only complete lines count
                past_last_end = not block.endswith(b"\n") and not self.complete_only
            while (index := block.rfind(b"\n", 0, index)) >= 0:
                if not past_last_end:
                    past_last_end = True  # the newline that ends the last line
                elif self._counts(block, start, start + index + 1):
                    return start + index + 1, self.count
            pos = start
        if past_last_end:
            self._counts(b"", 0, 0)  # the file's first line
        return 0, self.shown

    def _counts(self, block: bytes, block_start: int, line_start: int) -> bool:
        """Count the line starting at ``line_start`` if it is shown; whether ``count``
        lines are now counted."""
        if self.hide_task is not None:
            head = self._head(block, block_start, line_start)
            if is_detail_line(head, self.hide_task):
                return False
        self.shown += 1
        return self.shown == self.count

    def _head(self, block: bytes, block_start: int, line_start: int) -> bytes:
        """The first bytes of the line at ``line_start`` (enough to tell a detail line),
        from ``block`` when it holds them, else read from the file."""
        offset = line_start - block_start
        if 0 <= offset and offset + self.head_bytes <= len(block):
            head = block[offset : offset + self.head_bytes]
        else:
            self.handle.seek(line_start)
            head = self.handle.read(min(self.head_bytes, max(0, self.end - line_start)))
        return head.split(b"\n", 1)[0]


def read_merged(
    files: Iterable[LogFile],
    ends: dict[Path, int],
    *,
    follow: bool,
    skip: int = 0,
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[LogLine]:
    """The lines of ``files`` from their offsets up to ``ends[path]``, merged by time (a
    file's own order is kept; equal times keep the files' order), the first ``skip`` left
    out. Reads lazily, one batch per file at a time (see the module docstring); the
    batches of all files together hold about ``batch_bytes`` (a follow, of which many may
    wait at once, passes less than one answer's ``BATCH_BYTES``)."""
    chosen = list(files)
    budget = max(MIN_BATCH_BYTES, batch_bytes // max(1, len(chosen)))
    streams = [_stream(f, ends.get(f.path, 0), budget, follow) for f in chosen]
    for index, line in enumerate(heapq.merge(*streams, key=_stamp)):
        if index >= skip:
            yield line


def _stamp(line: LogLine) -> str:
    return line.stamp


def _stream(log: LogFile, end: int, budget_bytes: int, follow: bool) -> Iterator[LogLine]:
    while True:
        try:
            lines = log.batch(end, budget_bytes, follow)
        except FileNotFoundError:
            return
        if not lines:
            return
        yield from lines


DETAIL_READ_BYTES = 16 * 1024
"""How much of the head of a ``task.log`` ``read_detail`` reads: the header and its detail
lines are the runner's first lines."""


def read_detail(path: Path, task: str) -> list[str]:
    """The ``[task][detail]`` lines at the head of ``task``'s log (the isolation detail the
    runner writes after its one-line header), their text only; ``[]`` when the file is
    missing, unreadable or has none. Reads at most ``DETAIL_READ_BYTES``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(DETAIL_READ_BYTES)
    except OSError:
        return []
    prefix = len(f"[{task}][{DETAIL_TAG}] ") + 20
    return [
        escape_control(raw[prefix:].decode("utf-8", errors="replace"))
        for raw in head.split(b"\n")
        if is_detail_line(raw, task)
    ]


def file_size(path: Path) -> int:
    """``path``'s size now, 0 when it does not exist."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
