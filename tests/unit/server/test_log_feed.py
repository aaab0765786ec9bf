"""One shared reader per followed log (``streams.LogFeed``), issue 24: 200 followers of a
task that prints fast each read the same growing file themselves and kept ``/api/health``
over 1 s. Real files and the real follow code; the service under the cursors is a stub
(which files, whether the workflow ended). Nothing here is timed: every follower gets every
line once and in order, a follower that does not read does not hold the others (and still
gets every line, reading for itself once it fell out of the ring), the ring stays bounded,
and the lines are read once for all the followers that caught up."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from trainyard.server import streams
from trainyard.server.logs import LogFile
from trainyard.server.streams import LogFeeds, LogReaders, follow_chunks, text_lines
from trainyard.server.workflow_logs import FOLLOW_BATCH_BYTES, LogCursor

LINES = 3000
FOLLOWERS = 40
RING_BYTES = 8 * 1024


class Workflow:
    """What a ``LogCursor`` asks its ``WorkflowLogs``: the attempt's log file, and whether the
    workflow ended."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.ended = False
        self.engine = SimpleNamespace(
            state=lambda _wid: SimpleNamespace(
                status=SimpleNamespace(is_terminal=lambda: self.ended)
            )
        )

    def files(
        self,
        _wid: str,
        _task: Any,
        _retry: Any,
        *,
        failed_only: bool = False,
        verbose: bool = False,
    ) -> list[LogFile]:
        return [LogFile("t", 0, self.log, hide_detail=not verbose)]


class Counting(LogCursor):
    """A follower's own cursor, counting its own reads (the feed's copy is a plain one)."""

    reads = 0

    def read(self, max_bytes: int = FOLLOW_BATCH_BYTES) -> Any:
        type(self).reads += 1
        return super().read(max_bytes)


def line(i: int) -> str:
    return f"2026/01/01 00:00:00 [t] line {i:05d} of a task that prints fast"


async def collect(chunks: Any, into: list[str]) -> None:
    async for chunk in chunks:
        into.append(chunk)


async def scenario(workflow: Workflow, feeds: LogFeeds, peaks: list[int]) -> tuple[list[str], str]:
    readers = LogReaders(2)
    got: list[list[str]] = [[] for _ in range(FOLLOWERS)]
    slow = follow_chunks(
        Counting(workflow, "w", None, None, None, False),
        text_lines,
        readers,
        feeds=feeds,
        poll_s=0.02,
        max_poll_s=0.05,
    )
    slow_first = await slow.__anext__()  # it caught up once, then stops reading for a while
    async with anyio.create_task_group() as group:
        for i in range(FOLLOWERS):
            cursor = Counting(workflow, "w", None, None, None, False)
            group.start_soon(
                collect,
                follow_chunks(
                    cursor, text_lines, readers, feeds=feeds, poll_s=0.02, max_poll_s=0.05
                ),
                got[i],
            )
        with workflow.log.open("a") as handle:
            for start in range(100, LINES, 100):
                handle.write("".join(line(i) + "\n" for i in range(start, start + 100)))
                handle.flush()
                peaks.extend(f.held_bytes() for f in list(feeds._feeds.values()))
                await anyio.sleep(0.01)
        workflow.ended = True
    rest: list[str] = []
    await collect(slow, rest)
    return ["".join(g) for g in got], slow_first + "".join(rest)


def test_followers_share_one_reader_get_every_line_and_a_slow_one_holds_nobody(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "task.log"
    log.write_text("".join(line(i) + "\n" for i in range(100)))
    workflow = Workflow(log)
    feeds = LogFeeds(ring_bytes=RING_BYTES)
    peaks: list[int] = []
    texts, slow = anyio.run(scenario, workflow, feeds, peaks)
    expected = "".join(line(i) + "\n" for i in range(LINES))
    assert all(text == expected for text in texts), [len(t) for t in texts]
    assert slow == expected  # it fell out of the ring and read the rest itself
    assert len(feeds) == 0  # the last follower to leave dropped the feed
    assert peaks and max(peaks) <= RING_BYTES + FOLLOW_BATCH_BYTES, max(peaks)
    # each follower read for itself only to catch up (a few reads), the feed for all of
    # them: 41 followers reading every batch themselves would need thousands of reads
    assert Counting.reads < 12 * (FOLLOWERS + 1) + LINES // 100 * 2, Counting.reads


def test_a_follower_joins_only_where_the_ring_still_holds_what_it_lacks(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    log.write_text("".join(line(i) + "\n" for i in range(10)))
    workflow = Workflow(log)
    first = LogCursor(workflow, "w", None, None, None, False)
    late = LogCursor(workflow, "w", None, None, None, False)
    assert first.read()[1] and late.read()[1]  # both read the 10 lines and are at rest
    feeds = LogFeeds(ring_bytes=100)
    joined = feeds.join(first)
    assert joined is not None
    feed, start = joined
    with log.open("a") as handle:
        handle.write("".join(line(i) + "\n" for i in range(10, 20)))
    feed._read()
    assert feed.batch(start) is not None
    assert feeds.join(late) is not None  # the ring starts where it is
    feeds.leave(feed)
    with log.open("a") as handle:
        handle.write("".join(line(i) + "\n" for i in range(20, 40)))
    feed._read()
    feed._read()
    with pytest.raises(LookupError):
        feed.batch(start)  # the oldest batch left the 100-byte ring
    assert not feed.covers({("t", 0): first.offsets()[("t", 0)]})
    assert streams.FEED_RING_BYTES >= FOLLOW_BATCH_BYTES
