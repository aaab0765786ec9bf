"""Log lines of a workflow's task attempts for the API: read once up to now, or followed
step by step (``LogCursor``) until the workflow ends and its logs are drained. The bytes
are read by ``trainyard.server.logs``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from trainyard.engine import machine as m
from trainyard.engine.reconciler import Engine
from trainyard.errors import NotFoundError
from trainyard.server.auth import User
from trainyard.server.logs import (
    FLUSH,
    LogFile,
    LogLine,
    file_size,
    read_merged,
    tail_offset,
)
from trainyard.server.ownership import readable
from trainyard.status import Status


class WorkflowLogs:
    """The logs of one engine's workflows, for users who may read them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def files(
        self,
        workflow_id: str,
        task: str | None,
        retry_id: int | None,
        *,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> list[LogFile]:
        """The ``task.log`` of every attempt asked for, to be read from its start; with
        ``failed_only``, only of the attempts that failed (FAILED*, or RESCHEDULED: retried
        after a failure); the runner keeps a task's stdout and stderr in one stream, so
        ``logs --error`` means the failed attempts. Without ``verbose`` the files leave out
        the runner's isolation detail lines (``[task][detail]``).

        Raises:
            NotFoundError: the workflow has no task ``task``.
        """
        state = self.engine.state(workflow_id)
        if task is not None and task not in state.tasks:
            names = ", ".join(state.tasks)
            raise NotFoundError(f"workflow {workflow_id} has no task {task!r}; tasks: {names}")
        files = []
        for name, ts in state.tasks.items():
            if task is not None and name != task:
                continue
            retries = [retry_id] if retry_id is not None else range(ts.retry_id + 1)
            if failed_only:
                retries = [r for r in retries if r in _failed_attempts(ts)]
            files += [
                LogFile(
                    name,
                    r,
                    self.engine.run_dir(workflow_id, name, r) / "task.log",
                    hide_detail=not verbose,
                )
                for r in retries
            ]
        return files

    def read(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> Iterator[LogLine]:
        """Log lines of the workflow (all tasks merged by time), or of one task/attempt;
        with ``last_lines``, only the last that many (found from the files' ends).

        Who may read and what exists is checked now; the lines are read as the iterator is
        consumed, with bounded memory (``trainyard.server.logs``), up to where the files
        ended at this call.

        Raises:
            NotFoundError: no such workflow or task.
            ForbiddenError: another user's workflow and ``user`` is no admin.
        """
        readable(self.engine.store, workflow_id, user)
        files = self.files(workflow_id, task, retry_id, failed_only=failed_only, verbose=verbose)
        ends = {f.path: file_size(f.path) for f in files}
        skip = _start_at_last(files, ends, last_lines, complete_only=False)
        return read_merged(files, ends, follow=False, skip=skip)

    def follow(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
        poll_s: float = 0.2,
    ) -> Iterator[LogLine | None]:
        """Log lines as they are written, until the workflow ends and its logs are drained
        (a blocking iterator over ``open_follow``'s cursor, for callers with a thread of
        their own; the server's routes drive the cursor from async code instead).

        ``FLUSH`` (None) comes before each wait of ``poll_s``, so that a caller batching
        lines sends what it has.

        Raises:
            NotFoundError, ForbiddenError: as ``read``.
        """
        cursor = self.open_follow(
            workflow_id,
            user,
            task=task,
            retry_id=retry_id,
            last_lines=last_lines,
            failed_only=failed_only,
            verbose=verbose,
        )
        return _follow_blocking(cursor, poll_s)

    def open_follow(
        self,
        workflow_id: str,
        user: User,
        *,
        task: str | None = None,
        retry_id: int | None = None,
        last_lines: int | None = None,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> LogCursor:
        """A cursor that follows the workflow's logs step by step (``LogCursor.read``): the
        lines already written first (only the last ``last_lines`` of them when given, merged
        by time), then every new line as it appears, until the workflow ended and its logs
        are drained. Who may read and what exists is checked now, before any line (an HTTP
        error, not a broken stream).

        Raises:
            NotFoundError, ForbiddenError: as ``read``.
        """
        readable(self.engine.store, workflow_id, user)
        self.files(workflow_id, task, retry_id)
        return LogCursor(self, workflow_id, task, retry_id, last_lines, failed_only, verbose)


FOLLOW_BATCH_BYTES = 64 * 1024
"""Bytes of lines one follow reads ahead (all its files together): what each waiting
follower may hold, so that hundreds of them stay within tens of MB."""


class LogCursor:
    """One follow of a workflow's logs, read in steps (``read``) by whoever drives it.

    Not thread-safe: one caller at a time (the server's async routes run each ``read`` in
    a worker thread and wait between reads without one). Each step looks at the workflow's
    state once, reads what the files gained since the last step, and never sleeps.
    """

    def __init__(
        self,
        logs: WorkflowLogs,
        workflow_id: str,
        task: str | None,
        retry_id: int | None,
        last_lines: int | None,
        failed_only: bool,
        verbose: bool = False,
    ) -> None:
        self._logs = logs
        self._where = (workflow_id, task, retry_id, failed_only, verbose)
        self._last_lines = last_lines
        self._known: dict[Path, LogFile] = {}
        self._pass: Iterator[LogLine] | None = None
        self._final = False
        self._first = True
        self.ended = False
        """True once the workflow ended and every line was returned."""

    def read(self, max_bytes: int = FOLLOW_BATCH_BYTES) -> tuple[list[LogLine], bool]:
        """The next lines, about ``max_bytes`` of text at most (at least one line when
        there is one).

        Returns:
            ``(lines, wait)``: ``wait`` is true when the files hold nothing more now (the
            caller should wait a poll interval before the next ``read``); false when more
            may be read at once, or the follow ended (``ended``).
        """
        if self.ended:
            return [], False
        if self._pass is None:
            self._pass = self._start_pass()
        lines: list[LogLine] = []
        size = 0
        for line in self._pass:
            lines.append(line)
            size += len(line.text) + 1
            if size >= max_bytes:
                return lines, False
        self._pass = None
        self.ended = self._final
        return lines, not self.ended

    def begin(self) -> bool:
        """Place the cursor where its first pass would start (its last ``last_lines``
        lines, found from the files' ends), reading no line; True when it is then at rest
        (``at_rest``), so that a shared reader may serve it from there. False, leaving the
        first pass to ``read``: the workflow ended, or the last lines of several files must
        be merged to count them (some would be skipped)."""
        if not self._first:
            return self.at_rest()
        if self._logs.engine.state(self._where[0]).status.is_terminal():
            return False
        files = self._files()
        ends = {f.path: file_size(f.path) for f in files}
        if _start_at_last(files, ends, self._last_lines, complete_only=True):
            for log in files:
                log.offset = 0
            return False
        self._first = False
        return self.at_rest()

    @property
    def key(self) -> tuple[str, str | None, int | None, bool, bool]:
        """What is followed: ``(workflow_id, task, retry_id, failed_only, verbose)``;
        followers with the same key read the same lines (``streams.LogFeeds`` shares one
        reader)."""
        return self._where

    def at_rest(self) -> bool:
        """Whether a shared reader may take over from here: the first pass is done, no
        pass is in progress, no long line is half skipped and the follow has not ended."""
        return (
            not self._first
            and self._pass is None
            and not self.ended
            and not any(f.skipping for f in self._known.values())
        )

    def offsets(self) -> dict[tuple[str, int], int]:
        """How far each attempt's log was read: ``{(task, retry_id): byte offset}``."""
        return {(f.task, f.retry_id): f.offset for f in self._known.values()}

    def paths(self) -> dict[tuple[str, int], Path]:
        """Each known attempt's ``task.log``: ``{(task, retry_id): path}``."""
        return {(f.task, f.retry_id): f.path for f in self._known.values()}

    def advance(self, task: str, retry_id: int, path: Path, offset: int) -> None:
        """Record that the log of ``(task, retry_id)`` at ``path`` was delivered up to
        ``offset`` by someone else (a shared reader), so that this cursor's next pass goes
        on from there. Only while ``at_rest``."""
        known = self._known.get(path)
        if known is None:
            known = self._known[path] = LogFile(
                task, retry_id, path, hide_detail=not self._where[4]
            )
        known.offset = offset

    def copy(self) -> LogCursor:
        """A new cursor of the same key at the same offsets (its first pass done)."""
        twin = LogCursor(self._logs, *self._where[:3], None, self._where[3], self._where[4])
        twin._first = False
        twin._known = {
            p: LogFile(f.task, f.retry_id, p, f.offset, hide_detail=f.hide_detail)
            for p, f in self._known.items()
        }
        return twin

    def _files(self) -> list[LogFile]:
        """The followed attempts' logs now, each at the offset this cursor reached."""
        workflow_id, task, retry_id, failed_only, verbose = self._where
        return [
            self._known.setdefault(f.path, f)
            for f in self._logs.files(
                workflow_id, task, retry_id, failed_only=failed_only, verbose=verbose
            )
        ]

    def _start_pass(self) -> Iterator[LogLine]:
        """The lines the files gained since the last pass, up to their sizes now."""
        self._final = self._logs.engine.state(self._where[0]).status.is_terminal()
        files = self._files()
        ends = {f.path: file_size(f.path) for f in files}
        skip = 0
        if self._first:
            skip = _start_at_last(files, ends, self._last_lines, complete_only=not self._final)
            self._first = False
        return read_merged(
            files, ends, follow=not self._final, skip=skip, batch_bytes=FOLLOW_BATCH_BYTES
        )


def _follow_blocking(cursor: LogCursor, poll_s: float) -> Iterator[LogLine | None]:
    """``cursor``'s lines as one blocking iterator: ``FLUSH`` and a sleep of ``poll_s``
    whenever it has nothing more now."""
    while not cursor.ended:
        lines, wait = cursor.read()
        yield from lines
        if wait:
            yield FLUSH
            time.sleep(poll_s)


def _start_at_last(
    files: list[LogFile], ends: dict[Path, int], count: int | None, *, complete_only: bool
) -> int:
    """With ``count``: move each file's offset to where its last ``count`` lines start (read
    from its end; lines the file hides do not count) and return how many lines of the merge
    to skip so that ``count`` are left; 0 (and offsets kept) without it."""
    if not count:
        return 0
    total = 0
    for log in files:
        log.offset, lines = tail_offset(
            log.path,
            ends[log.path],
            count,
            complete_only=complete_only,
            hide_task=log.task if log.hide_detail else None,
        )
        total += lines
    return max(0, total - count)


def _attempt_failed(status: Status) -> bool:
    """An attempt that failed: FAILED*, or RESCHEDULED (it failed and a new attempt runs)."""
    return status.is_failed() or status is Status.RESCHEDULED


def _failed_attempts(ts: m.TaskState) -> set[int]:
    """The retry ids of ``ts``'s attempts that failed (earlier ones and the current)."""
    failed = {a.retry_id for a in ts.history if _attempt_failed(a.status)}
    return failed | ({ts.retry_id} if _attempt_failed(ts.status) else set())
