"""Long-lived answers (log follow, the dashboard's SSE log stream) that hold no thread while
they wait.

Each stream is an async generator on the server's event loop that reads its files in short
steps in the log readers' own thread pool (``LogReaders``: at most ``READER_THREADS``, apart
from the synchronous routes' workers) and waits with ``anyio.sleep``. Followers of the same
lines share one reader (``LogFeed``: a bounded ring of batches, each rendered once per format);
a follower that falls out of the ring reads for itself from where it was, losing no line.
Open streams are counted per user and in all (``StreamSlots``); beyond
``MAX_STREAMS_PER_USER`` (or ``MAX_STREAMS``) a new one is refused with 429 (``TooBusyError``)
before its answer starts. Why: docs/logs.md, "Followers".
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from trainyard.errors import TooBusyError
from trainyard.server.logs import LogLine
from trainyard.server.workflow_logs import FOLLOW_BATCH_BYTES, LogCursor

__all__ = [
    "READER_THREADS",
    "MAX_STREAMS_PER_USER",
    "MAX_STREAMS",
    "POLL_S",
    "MAX_POLL_S",
    "SSE_KEEPALIVE_S",
    "FEED_RING_BYTES",
    "LogReaders",
    "StreamSlots",
    "SlotResponse",
    "LogFeed",
    "LogFeeds",
    "follow_chunks",
    "iterate_in_readers",
    "sse_events",
    "text_lines",
    "json_lines",
]

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
dashboard's target is 0.5 s, docs/benchmarks.md "Dashboard: list page, log follow")."""
MAX_STEP_PAUSE_S = 0.05
"""The longest pause of a reader thread after a step (see ``_step``)."""
SSE_KEEPALIVE_S = 15.0
"""An SSE comment is sent after this long without a line (proxies close silent streams)."""
FEED_RING_BYTES = 2 << 20
"""Bytes of lines a shared reader keeps for its followers (and their renderings, once per
format): a follower further behind reads for itself again."""


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
                raise TooBusyError(
                    f"{user} has {mine} log streams open, the most one user "
                    "may; close one (or wait for its workflow to end)"
                )
            if sum(self._open.values()) >= self.total:
                raise TooBusyError(
                    f"the server has {self.total} log streams open, the most "
                    "it serves; try again later"
                )
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

    def __init__(
        self, content: AsyncIterator[str], slots: StreamSlots, user: str, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._slots, self._user = slots, user

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give_back(self._user)
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:  # a stream's shared reader is left now, not when collected
                with anyio.CancelScope(shield=True):
                    await aclose()


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


Key = tuple[str, str | None, int | None, bool, bool]
"""What a follow reads: ``LogCursor.key`` (workflow, task, retry id, failed only, verbose)."""
FileKey = tuple[str, int]


@dataclass
class _Batch:
    """Lines one read of a feed returned, with where each lies in its file."""

    seq: int
    lines: list[LogLine]
    paths: dict[FileKey, Path]
    size: int
    starts: dict[FileKey, int] = field(default_factory=dict)
    """Per file, where its first line in the batch starts."""
    ends: dict[FileKey, int] = field(default_factory=dict)
    """Per file, where its last line in the batch ends."""
    rendered: dict[Callable[[list[LogLine]], str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for line in self.lines:
            if line.span is not None:
                key = (line.task, line.retry_id)
                self.starts.setdefault(key, line.span[0])
                self.ends[key] = line.span[1]

    def render(self, render: Callable[[list[LogLine]], str]) -> str:
        """All the batch's lines as ``render`` writes them, made once per format."""
        text = self.rendered.get(render)
        if text is None:
            text = self.rendered[render] = render(self.lines) if self.lines else ""
        return text


class LogFeed:
    """One reader of the lines of one key (``LogCursor.key``) for every follower that has
    caught up: a ring of recent batches (at most ``ring_bytes`` of text), filled by whichever
    follower finds it empty (one read at a time, in the readers' threads)."""

    def __init__(self, cursor: LogCursor, ring_bytes: int = FEED_RING_BYTES) -> None:
        """Args:
        cursor: where the feed starts; a copy is taken (``LogCursor.copy``).
        ring_bytes: the most text kept (the newest batch always is).
        """
        self.cursor = cursor.copy()
        self.ring_bytes = ring_bytes
        self.batches: deque[_Batch] = deque()
        self.next_seq = 0
        self.ended = False
        self.followers = 0
        self._held = 0
        self._lock = threading.Lock()
        self._reading: anyio.Lock | None = None
        self._changed: anyio.Event | None = None
        self._quiet_until = 0.0
        self._delay = POLL_S
        self._reached = self.cursor.offsets()

    @property
    def first_seq(self) -> int:
        """The sequence number of the oldest batch kept (``next_seq`` when none)."""
        with self._lock:
            return self.batches[0].seq if self.batches else self.next_seq

    def held_bytes(self) -> int:
        """Bytes of line text in the ring now."""
        with self._lock:
            return self._held

    def covers(self, offsets: dict[FileKey, int]) -> bool:
        """Whether a follower that read each file up to ``offsets`` finds every later line
        here: per file, the ring starts at or before its offset (or the feed reads that
        file from where the follower is, or from its start, later)."""
        with self._lock:
            reached = self._reached
            earliest: dict[FileKey, int] = {}
            for batch in self.batches:
                for key, start in batch.starts.items():
                    earliest.setdefault(key, start)
            for key in set(offsets) | set(reached):
                available = earliest.get(key, reached.get(key, 0))
                if offsets.get(key, 0) < available:
                    return False
            return True

    def batch(self, seq: int) -> _Batch | None:
        """Batch ``seq``, or None when it is not read yet.

        Raises:
            LookupError: it left the ring already (the follower is too slow).
        """
        with self._lock:
            if seq >= self.next_seq:
                return None
            if not self.batches or seq < self.batches[0].seq:
                raise LookupError(seq)
            return self.batches[seq - self.batches[0].seq]

    def _read(self) -> tuple[bool, bool]:
        """One read of what the files gained (in a reader thread), added to the ring, then
        a pause as ``_step``'s. Returns whether it found lines, and whether the files hold
        nothing more now."""
        start = time.monotonic()
        lines, wait = self.cursor.read(FOLLOW_BATCH_BYTES)
        size = sum(len(line.text) + 1 for line in lines)
        with self._lock:
            if lines:
                self.batches.append(_Batch(self.next_seq, lines, self.cursor.paths(), size))
                self.next_seq += 1
                self._held += size
                while len(self.batches) > 1 and self._held > self.ring_bytes:
                    self._held -= self.batches.popleft().size
            self._reached = self.cursor.offsets()
            self.ended = self.cursor.ended
        time.sleep(min(time.monotonic() - start, MAX_STEP_PAUSE_S))
        return bool(lines), wait

    async def pull(self, readers: LogReaders, *, poll_s: float, max_poll_s: float) -> None:
        """Wait for the next batch: read it when nobody is reading and the files are not
        known to be quiet, else wait until another follower's read ends (or a poll
        interval). Never loses a read: the ring is filled inside the reader thread."""
        if self._reading is None:
            self._reading, self._changed = anyio.Lock(), anyio.Event()
        assert self._changed is not None
        now = time.monotonic()
        if self._reading.locked() or now < self._quiet_until:
            changed = self._changed
            with anyio.move_on_after(max(self._quiet_until - now, 0.0) or max_poll_s):
                await changed.wait()
            return
        async with self._reading:
            changed = self._changed
            try:
                found, wait = await readers.run(self._read)
            finally:
                self._changed = anyio.Event()
                changed.set()
            if found:
                self._delay = poll_s
            if wait:  # as a follower alone: poll_s after lines, growing while quiet
                self._quiet_until = time.monotonic() + self._delay
                self._delay = min(max_poll_s, self._delay * 1.5)
            else:
                self._quiet_until = 0.0


class LogFeeds:
    """The shared readers of a server, one per followed key while it has followers."""

    def __init__(self, ring_bytes: int = FEED_RING_BYTES) -> None:
        self.ring_bytes = ring_bytes
        self.readers = LogReaders(1)
        """The feeds' own reader thread: a feed's read (which serves every follower that
        caught up) never queues behind the private reads of followers still catching up."""
        self._feeds: dict[Key, LogFeed] = {}
        self._lock = threading.Lock()

    def join(self, cursor: LogCursor) -> tuple[LogFeed, int] | None:
        """The feed ``cursor``'s follower may switch to and the batch to start at, or None
        while it may not (``LogCursor.at_rest`` false, or the feed's ring no longer holds
        what the follower lacks: it reads for itself and asks again later)."""
        if not cursor.at_rest():
            return None
        with self._lock:
            feed = self._feeds.get(cursor.key)
            if feed is None:
                feed = self._feeds[cursor.key] = LogFeed(cursor, self.ring_bytes)
                start = feed.next_seq
            elif feed.covers(cursor.offsets()):
                start = feed.first_seq
            else:
                return None
            feed.followers += 1
            return feed, start

    def leave(self, feed: LogFeed) -> None:
        """One follower less; the last one's leaving drops the feed."""
        with self._lock:
            feed.followers -= 1
            if feed.followers <= 0 and self._feeds.get(feed.cursor.key) is feed:
                del self._feeds[feed.cursor.key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._feeds)


def _unseen(batch: _Batch, cursor: LogCursor, render: Callable[[list[LogLine]], str]) -> str:
    """The lines of ``batch`` that ``cursor`` has not delivered yet, rendered; the cursor's
    offsets advance past them."""
    had = cursor.offsets()
    for (task, retry_id), end in batch.ends.items():
        if end > had.get((task, retry_id), 0) and (task, retry_id) in batch.paths:
            cursor.advance(task, retry_id, batch.paths[(task, retry_id)], end)
    if all(start >= had.get(key, 0) for key, start in batch.starts.items()):
        return batch.render(render)  # the usual case: all of it is new, rendered once
    fresh = [
        line
        for line in batch.lines
        if line.span is None or line.span[0] >= had.get((line.task, line.retry_id), 0)
    ]
    return render(fresh) if fresh else ""


async def follow_chunks(
    cursor: LogCursor,
    render: Callable[[list[LogLine]], str],
    readers: LogReaders,
    *,
    keepalive: str = "",
    keepalive_s: float = SSE_KEEPALIVE_S,
    poll_s: float = POLL_S,
    max_poll_s: float = MAX_POLL_S,
    feeds: LogFeeds | None = None,
) -> AsyncGenerator[str]:
    """The text of ``cursor``'s lines as they come, ``render``ed in steps of about
    ``FOLLOW_BATCH_BYTES``, until the follow ended.

    With ``feeds`` it joins the shared reader of its key as soon as that reader's ring
    holds where it starts (``LogCursor.begin``: at once for a log still short enough), else
    once it has caught up reading for itself; it reads for itself again if it falls out of
    the ring.
    Between steps that found nothing new it sleeps (``poll_s``, growing by half each quiet
    step up to ``max_poll_s``) holding no thread; with ``keepalive``, that text goes out
    after ``keepalive_s`` without a line. Cancelled (the client left), it stops at its next
    wait, or as soon as a step in progress returns.
    """
    delay, quiet_s = poll_s, 0.0
    joinable = feeds is not None and await readers.run(cursor.begin)
    idle = False  # the last read found nothing more for now
    while True:
        if joinable and feeds is not None:
            joinable = False
            joined = feeds.join(cursor)
            if joined is not None:
                feed, seq = joined
                try:
                    async for chunk in _from_feed(
                        feed,
                        seq,
                        cursor,
                        render,
                        feeds.readers,
                        keepalive,
                        keepalive_s,
                        poll_s,
                        max_poll_s,
                    ):
                        yield chunk
                finally:
                    feeds.leave(feed)
                if cursor.ended:
                    return
                idle = False
                continue  # fell out of the ring: read for itself from where it is
        if idle:
            idle = False
            await anyio.sleep(delay)
            quiet_s += delay
            delay = min(max_poll_s, delay * 1.5)
            if keepalive and quiet_s >= keepalive_s:
                quiet_s = 0.0
                yield keepalive
        text, wait = await readers.run(_step, cursor, render)
        if text:
            yield text
            delay, quiet_s = poll_s, 0.0
        if cursor.ended:
            return
        if wait:
            idle, joinable = True, feeds is not None


async def _from_feed(
    feed: LogFeed,
    seq: int,
    cursor: LogCursor,
    render: Callable[[list[LogLine]], str],
    readers: LogReaders,
    keepalive: str,
    keepalive_s: float,
    poll_s: float,
    max_poll_s: float,
) -> AsyncIterator[str]:
    """The batches of ``feed`` from ``seq`` on, less what ``cursor`` had; ends when the
    feed ended and was drained, or when the follower fell out of the ring."""
    quiet_since = time.monotonic()
    while True:
        try:
            batch = feed.batch(seq)
        except LookupError:
            return
        if batch is not None:
            seq += 1
            text = _unseen(batch, cursor, render)
            if text:
                yield text
                quiet_since = time.monotonic()
            continue
        if feed.ended:  # the workflow ended and the feed read every line: so did this one
            cursor.ended = True
            return
        await feed.pull(readers, poll_s=poll_s, max_poll_s=max_poll_s)
        if keepalive and time.monotonic() - quiet_since >= keepalive_s:
            quiet_since = time.monotonic()
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
