"""The engine's loop wakes on a submit and on a backend's notification of new facts, with its
tick as the upper bound between steps; stored changes wake ``wait_for_change`` (issue 15).

The tick is set to 60 s here, so whatever happens within a few seconds happened because of a
wake-up: without one, nothing would move before the minute is over. The fake backend and a
real SQLite store, the loop in a thread as the server runs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status
from trainyard.store import Store

TICK_S = 60.0
SOON_S = 10.0  # far below the tick, far above a step on a loaded 2-core machine
POOL = Pool(name="local", nodes=[NodeSpec(name="n0", gpu=8)])
SPEC = WorkflowSpec.model_validate({"name": "w", "tasks": [{"name": "t", "command": ["true"]}]})


class NotifyingBackend(FakeBackend):
    """The fake backend with the ``notify_facts`` hook: ``tell()`` is a runner's datagram."""

    def __init__(self, script: Callable[..., Outcome]) -> None:
        super().__init__(script)
        self.wakes: list[Callable[[], None]] = []

    def notify_facts(self, wake: Callable[[], None]) -> bool:
        self.wakes.append(wake)
        return True

    def tell(self) -> None:
        for wake in self.wakes:
            wake()


class Loop:
    """An engine whose ``run_forever`` runs in a thread with a ``TICK_S`` tick."""

    def __init__(self, tmp_path: Path, store_url: str, backend: FakeBackend) -> None:
        self.engine = Engine(
            Store(store_url),
            tmp_path,
            pools={"local": POOL},
            backend_factory=lambda p, h: backend,
            poll_interval_s=TICK_S,
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(
            target=self.engine.run_forever, args=(self.stop,), daemon=True
        )
        self.thread.start()

    def submit(self) -> str:
        return self.engine.submit(Submission(spec=SPEC, spec_text="", user="u", pool=POOL)).id

    def until(self, what: Callable[[], bool]) -> float:
        """Seconds until ``what()`` held; fails after ``SOON_S``."""
        started = time.monotonic()
        while not what():
            assert time.monotonic() - started < SOON_S, "nothing happened without the tick"
            time.sleep(0.01)
        return time.monotonic() - started

    def close(self) -> None:
        self.stop.set()
        self.engine.wake()
        self.thread.join(timeout=TICK_S + 5)
        assert not self.thread.is_alive()


@pytest.fixture()
def make_loop(tmp_path: Path, store_url: str) -> Iterator[Callable[[FakeBackend], Loop]]:
    loops: list[Loop] = []

    def make(backend: FakeBackend) -> Loop:
        loops.append(Loop(tmp_path, store_url, backend))
        return loops[-1]

    yield make
    for loop in loops:
        loop.close()


def test_a_submit_is_started_at_once_not_at_the_next_tick(make_loop) -> None:
    backend = FakeBackend(lambda launch: Outcome(None))
    loop = make_loop(backend)
    time.sleep(0.2)  # the loop's first step is done: it now waits out its tick
    loop.submit()
    loop.until(lambda: len(backend.launches) == 1)


def test_a_backends_notification_makes_the_next_step(make_loop) -> None:
    backend = NotifyingBackend(lambda launch: Outcome(0, polls=1))
    loop = make_loop(backend)
    assert backend.wakes == []  # the hook is given once the pool's backend is made
    wid = loop.submit()
    loop.until(lambda: len(backend.launches) == 1)
    assert backend.wakes == [loop.engine.core.wake]  # what Engine.wake calls
    task = lambda: loop.engine.state(wid).tasks["t"].status  # noqa: E731
    # Each poll of the fake moves the task on (INITIALIZING and RUNNING, then EXITED 0), and
    # only a step polls: every notification must move it, until it COMPLETED. (A submit made
    # while the loop's first step was under way may leave one wake-up over: a step more.)
    told = 0
    while (before := task()) is not Status.COMPLETED:
        assert told < 3, f"still {before} after {told} notifications"
        backend.tell()
        told += 1
        loop.until(lambda: task() is not before)
    assert told >= 1


def test_stop_is_seen_within_the_tick_also_when_woken_often(tmp_path: Path, store_url: str) -> None:
    engine = Engine(
        Store(store_url),
        tmp_path,
        pools={"local": POOL},
        backend_factory=lambda p, h: FakeBackend(),
        poll_interval_s=0.05,
    )
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
    thread.start()
    for _ in range(20):
        engine.wake()
        time.sleep(0.005)
    stop.set()
    thread.join(timeout=SOON_S)
    assert not thread.is_alive()


def test_wait_for_change_returns_when_states_are_stored_or_after_its_timeout(
    tmp_path: Path, store_url: str
) -> None:
    engine = Engine(
        Store(store_url),
        tmp_path,
        pools={"local": POOL},
        backend_factory=lambda p, h: FakeBackend(),
    )
    seen = engine.changes()
    started = time.monotonic()
    assert engine.wait_for_change(seen, 0.2) is False
    assert time.monotonic() - started >= 0.19
    timer = threading.Timer(
        0.1,
        lambda: (
            engine.submit(Submission(spec=SPEC, spec_text="", user="u", pool=POOL))
            and engine.step()
        ),
    )
    timer.start()
    started = time.monotonic()
    assert engine.wait_for_change(seen, TICK_S) is True
    assert time.monotonic() - started < SOON_S
    assert engine.changes() != seen
    timer.join()
