"""Long-lived answers (log follow, the dashboard's SSE log stream) that hold no thread while
they wait.

Each stream is an async generator on the server's event loop. It reads its files in short
steps in a worker thread of the log readers' own pool (``LogReaders``: at most
``READER_THREADS`` at once, apart from the worker pool of the synchronous routes, so that
readers never starve submits or queries), and waits between steps with ``anyio.sleep``:
a follower of a quiet task costs a coroutine and a socket, not a thread (issue 24: 45
followers of a quiet task used to take every worker thread and hang ``/api/health``).

Open streams are counted per user and in all (``StreamSlots``); beyond
``MAX_STREAMS_PER_USER`` (or ``MAX_STREAMS``) a new one is refused with 429
(``TooBusyError``) before its answer starts.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from trainyard.errors import TooBusyError
from trainyard.server.logs import LogLine
from trainyard.server.service import FOLLOW_BATCH_BYTES, LogCursor

__all__ = ["READER_THREADS", "MAX_STREAMS_PER_USER", "MAX_STREAMS", "POLL_S", "MAX_POLL_S",
           "SSE_KEEPALIVE_S", "LogReaders", "StreamSlots", "SlotResponse", "follow_chunks",
           "iterate_in_readers", "sse_events", "text_lines", "json_lines"]

READER_THREADS = 2
"""Worker threads that read log files for every stream together
(``$TRAINYARD_LOG_READER_THREADS`` sets another number). Few on purpose: each competes with
the event loop for the GIL, and the loop answers health and every stream; with 200
followers and 20 SSE streams on a busy 2-core machine, one run each gave a health p99 of
1.6 s with 4 threads and 0.13 s with 2 (docs/benchmarks-history.md: the machine's noise is
large)."""
MAX_STREAMS_PER_USER = 256
"""Log follows and SSE streams one user may hold open at once (task tokens count as their
submitter); ``$TRAINYARD_MAX_STREAMS_PER_USER`` sets another number."""
MAX_STREAMS = 2048
"""Streams open at once for all users together."""
POLL_S = 0.2
"""A follow's first wait after its files had nothing new; it grows to ``MAX_POLL_S`` while
they stay quiet, and drops back at the next line."""
MAX_POLL_S = 0.4
"""The longest wait between two looks: a line reaches the page within about this (the
dashboard's target is 0.5 s, docs/benchmarks.md "Log follow")."""
MAX_STEP_PAUSE_S = 0.05
"""The longest pause of a reader thread after a step (see ``_step``)."""
SSE_KEEPALIVE_S = 15.0
"""An SSE comment is sent after this long without a line (proxies close silent streams)."""


class LogReaders:
    """The worker threads that log streams read files in (an anyio ``CapacityLimiter`` of
    ``threads``, made on first use inside the event loop)."""

    def __init__(self, threads: int | None = None) -> None:
        """Args:
            threads: how many; None: ``$TRAINYARD_LOG_READER_THREADS``, else
                ``READER_THREADS``.
        """
        env = os.environ.get("TRAINYARD_LOG_READER_THREADS", "")
        self.threads = threads or (int(env) if env.isdigit() and int(env) > 0 else READER_THREADS)
        self._limiter: anyio.CapacityLimiter | None = None

    async def run(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` in one of the readers' threads; the caller's coroutine waits
        without holding a thread of its own."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(self.threads)
        return await anyio.to_thread.run_sync(func, *args, limiter=self._limiter)


class StreamSlots:
    """Counts of open streams, per user and in all. Thread-safe."""

    def __init__(self, per_user: int | None = None, total: int = MAX_STREAMS) -> None:
        """Args:
            per_user: the cap per user; None: ``$TRAINYARD_MAX_STREAMS_PER_USER``, else
                ``MAX_STREAMS_PER_USER``.
        """
        env = os.environ.get("TRAINYARD_MAX_STREAMS_PER_USER", "")
        self.per_user = per_user or (int(env) if env.isdigit() else MAX_STREAMS_PER_USER)
        self.total = total
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, user: str) -> None:
        """Count one more stream of ``user``.

        Raises:
            TooBusyError: ``user`` holds ``per_user`` streams already, or all users
                ``total`` (HTTP 429); nothing is counted then.
        """
        with self._lock:
            mine = self._open.get(user, 0)
            if mine >= self.per_user:
                raise TooBusyError(f"{user} has {mine} log streams open, the most one user "
                                   "may; close one (or wait for its workflow to end)")
            if sum(self._open.values()) >= self.total:
                raise TooBusyError(f"the server has {self.total} log streams open, the most "
                                   "it serves; try again later")
            self._open[user] = mine + 1

    def give_back(self, user: str) -> None:
        """Count one stream of ``user`` less (each ``take`` is given back once)."""
        with self._lock:
            left = self._open.get(user, 0) - 1
            if left > 0:
                self._open[user] = left
            else:
                self._open.pop(user, None)

    def held(self, user: str | None = None) -> int:
        """Streams open now: of ``user``, or of everyone."""
        with self._lock:
            return self._open.get(user, 0) if user else sum(self._open.values())


class SlotResponse(StreamingResponse):
    """A ``StreamingResponse`` that gives its stream slot back however it ends (drained,
    failed, or cancelled when the client went away)."""

    def __init__(self, content: AsyncIterator[str], slots: StreamSlots, user: str,
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._slots, self._user = slots, user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give_back(self._user)


def text_lines(lines: list[LogLine]) -> str:
    """OSMO's text format: each line's text and a newline."""
    return "".join(line.text + "\n" for line in lines)


def json_lines(lines: list[LogLine]) -> str:
    """JSON Lines: one ``LogLine.to_json`` object per line."""
    return "".join(json.dumps(line.to_json()) + "\n" for line in lines)


def sse_events(lines: list[LogLine]) -> str:
    """Server-Sent Events: one ``data:`` JSON object per line."""
    return "".join(f"data: {json.dumps(line.to_json())}\n\n" for line in lines)


def _step(cursor: LogCursor, render: Callable[[list[LogLine]], str]) -> tuple[str, bool]:
    """One read of ``cursor``, rendered (in a reader thread), then a pause as long as the
    step took (at most ``MAX_STEP_PAUSE_S``) before the thread serves the next: the readers
    hold the GIL at most about half the time, so that the event loop (health, every
    answer) is never starved by streams that have more to read than the CPU can serve."""
    start = time.monotonic()
    lines, wait = cursor.read(FOLLOW_BATCH_BYTES)
    text = render(lines) if lines else ""
    time.sleep(min(time.monotonic() - start, MAX_STEP_PAUSE_S))
    return text, wait


async def follow_chunks(cursor: LogCursor, render: Callable[[list[LogLine]], str],
                        readers: LogReaders, *, keepalive: str = "",
                        keepalive_s: float = SSE_KEEPALIVE_S, poll_s: float = POLL_S,
                        max_poll_s: float = MAX_POLL_S) -> AsyncIterator[str]:
    """The text of ``cursor``'s lines as they come, ``render``ed in steps of about
    ``FOLLOW_BATCH_BYTES``, until the follow ended.

    Between steps that found nothing new it sleeps (``poll_s``, growing by half each
    quiet step up to ``max_poll_s``) holding no thread; with ``keepalive``, that text
    goes out after ``keepalive_s`` without a line. Cancelled (the client left), it stops
    at its next wait, or as soon as a step in progress returns.
    """
    delay, quiet_s = poll_s, 0.0
    while True:
        text, wait = await readers.run(_step, cursor, render)
        if text:
            yield text
            delay, quiet_s = poll_s, 0.0
        if cursor.ended:
            return
        if not wait:
            continue
        await anyio.sleep(delay)
        quiet_s += delay
        delay = min(max_poll_s, delay * 1.5)
        if keepalive and quiet_s >= keepalive_s:
            quiet_s = 0.0
            yield keepalive


_DONE = object()


async def iterate_in_readers(chunks: Iterator[str], readers: LogReaders) -> AsyncIterator[str]:
    """``chunks`` (a blocking iterator that never waits for new data: a log read to its
    end now) pulled one at a time in the readers' threads."""
    while True:
        chunk = await readers.run(next, chunks, _DONE)
        if chunk is _DONE:
            return
        yield chunk
