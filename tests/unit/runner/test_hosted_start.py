"""A hosted runner's thread is started without waiting for it to run (issue 11, throughput:
``threading.Thread.start`` waits for the new thread to hold the GIL once, up to a switch
interval or more while other runner threads run Python, on the launcher's serial loop), and
``is_alive``/``join`` still follow the thread."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from trainyard.runner.hosted import ENDED, HostedRunner


def test_start_returns_before_the_thread_ran_and_the_thread_is_followed(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("{not json")  # the runner ends at once, reporting it
    entered = threading.Event()
    go = threading.Event()

    def first() -> None:
        entered.set()
        go.wait(30)

    runner = HostedRunner(tmp_path / "run.json", tmp_path / "runner.out", {}, first=first)
    assert not runner.is_alive()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)  # this thread keeps the GIL until it blocks
    try:
        runner.start()
        ran_before_start_returned = entered.is_set()
    finally:
        sys.setswitchinterval(interval)
    assert not ran_before_start_returned  # Thread.start would have let it run first
    assert entered.wait(30) and runner.is_alive()
    go.set()
    runner.join(30)
    assert not runner.is_alive() and (tmp_path / ENDED).exists()
    assert "Error" in (tmp_path / "runner.out").read_text()
