"""The barrier releases all ranks together and fails clearly on duplicate or stray ranks."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from training_support import free_port

from trainyard.training.barrier import (
    EXIT_FAILED,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    join_barrier,
    run_barrier,
)
from trainyard.training.errors import BarrierFailed, BarrierTimeout


class Rank(threading.Thread):
    """One rank of the barrier in a thread; records when it was released and how."""

    def __init__(self, num_nodes: int, rank: int, port: int, timeout_s: float = 20.0) -> None:
        super().__init__(daemon=True)
        self.args = (num_nodes, rank, "127.0.0.1", port, timeout_s, "127.0.0.1", lambda _m: None)
        self.released_at: float | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            run_barrier(*self.args)
            self.released_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc


def _start(*ranks: Rank, pause_s: float = 0.0) -> None:
    for rank in ranks:
        rank.start()
        time.sleep(pause_s)


def test_ranks_are_held_until_the_last_arrives_then_released_together() -> None:
    port = free_port()
    early = [
        Rank(4, 1, port),
        Rank(4, 0, port),
        Rank(4, 3, port),
    ]  # a worker may start before rank 0
    _start(*early, pause_s=0.2)
    time.sleep(1.0)
    assert all(r.is_alive() for r in early), "nobody may pass before rank 2 arrives"
    last = Rank(4, 2, port)
    arrived = time.monotonic()
    _start(last)
    for rank in (*early, last):
        rank.join(10)
    assert all(r.error is None for r in (*early, last)), [r.error for r in early]
    times = [r.released_at for r in (*early, last)]
    assert min(times) >= arrived
    assert max(times) - min(times) < 0.5


def test_a_single_node_barrier_releases_at_once() -> None:
    run_barrier(1, 0, None, free_port(), 5.0, "127.0.0.1", lambda _m: None)


def test_a_duplicate_rank_fails_everyone_with_a_clear_error() -> None:
    port = free_port()
    ranks = [Rank(3, 0, port), Rank(3, 1, port), Rank(3, 1, port)]
    _start(*ranks, pause_s=0.2)
    for rank in ranks:
        rank.join(10)
    assert all(isinstance(r.error, BarrierFailed) for r in ranks), [r.error for r in ranks]
    assert all("more than one node with rank 1" in str(r.error) for r in ranks)


def test_a_rank_outside_the_range_fails_everyone() -> None:
    port = free_port()
    server, good = Rank(3, 0, port), Rank(3, 1, port)
    _start(server, good, pause_s=0.2)
    with pytest.raises(BarrierFailed, match=r"rank 5 connected, outside of the range \[1, 2\]"):
        join_barrier(
            5, "127.0.0.1", port, 10.0, log=lambda _m: None
        )  # e.g. a task told --num_nodes 6
    server.join(10), good.join(10)
    assert isinstance(server.error, BarrierFailed) and isinstance(good.error, BarrierFailed)


@pytest.mark.parametrize(
    "num_nodes, rank, connect, message",
    [
        (3, 3, "h", r"--rank 3 is out of range: it must lie in \[0, 2\]"),
        (3, -1, "h", "out of range"),
        (3, 1, None, "needs --connect"),
        (0, 0, None, "--num_nodes must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_network(num_nodes, rank, connect, message) -> None:
    with pytest.raises(ValueError, match=message):
        run_barrier(num_nodes, rank, connect, 1, 1.0)


def test_rank_0_times_out_naming_the_missing_ranks() -> None:
    started = time.monotonic()
    with pytest.raises(BarrierTimeout, match="waiting on ranks: 1, 2"):
        run_barrier(3, 0, None, free_port(), 0.5, "127.0.0.1", lambda _m: None)
    assert time.monotonic() - started < 5


def test_a_worker_times_out_when_rank_0_never_comes() -> None:
    with pytest.raises(BarrierTimeout, match="could not reach rank 0"):
        run_barrier(2, 1, "127.0.0.1", free_port(), 0.5, log=lambda _m: None)


def test_a_worker_that_leaves_may_come_back() -> None:
    port = free_port()
    server = Rank(3, 0, port)
    _start(server)
    flaky = Rank(3, 1, port, timeout_s=0.8)  # gives up (timeout) while rank 2 is missing
    _start(flaky)
    flaky.join(5)
    assert isinstance(flaky.error, BarrierTimeout)
    again, last = Rank(3, 1, port), Rank(3, 2, port)
    _start(again, last)
    for rank in (server, again, last):
        rank.join(10)
    assert [r.error for r in (server, again, last)] == [None, None, None]


def _cli(*args: str, timeout: float = 30) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard.training.barrier", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_command_line_tool_releases_and_reports_exit_codes() -> None:
    port = str(free_port())
    procs = [
        _cli("--num_nodes", "3", "--rank", str(r), "--connect", "127.0.0.1", "--port", port)
        for r in (1, 0, 2)
    ]
    outs = [p.communicate(timeout=30) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert all("all 3 ranks arrived, released" in out for out, _ in outs)

    proc = _cli("--num_nodes", "2", "--rank", "2", "--connect", "x")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_USAGE and "--rank 2 is out of range" in err
    proc = _cli("--num_nodes", "2", "--rank", "0", "--port", port, "--timeout-s", "0.3")
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_TIMEOUT and "waiting on ranks: 1" in err


def test_a_second_rank_0_cannot_take_the_port() -> None:
    port = free_port()
    first = Rank(2, 0, port)
    _start(first, pause_s=0.3)
    with pytest.raises(BarrierFailed, match="cannot listen"):
        run_barrier(2, 0, None, port, 2.0, "127.0.0.1", lambda _m: None)
    join_barrier(1, "127.0.0.1", port, 10.0, log=lambda _m: None)
    first.join(10)
    assert first.error is None
    assert EXIT_FAILED == 1
