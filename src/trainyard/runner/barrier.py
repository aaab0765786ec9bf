"""The gang barrier: every task of a group waits for all the others before its command runs.

Each task writes ``<folder>/<task>.ready`` (atomically: a temporary name, then a rename) and
polls the folder until every task of the group has a ready mark (soon at first, then less
often: ``FIRST_POLL_S``). The folder is on a
filesystem every task of the group sees (the local machine, or the cluster's shared
filesystem on Slurm). OSMO: "Groups" (tasks of a group start their commands together).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from trainyard.runner.spec import Barrier

__all__ = ["BarrierTimeout", "mark_ready", "wait_for_group", "FIRST_POLL_S"]

FIRST_POLL_S = 0.005
"""The first look at the folder comes this soon, then each wait is 1.5 times longer, up to
the barrier's ``poll_interval_s``: a gang started together passes within a few ms of its last
task's mark (instead of up to a whole ``poll_interval_s``), and a long wait still costs only a
look per ``poll_interval_s``."""


class BarrierTimeout(Exception):
    """Not every task of the group was ready in time; ``missing`` names those absent."""

    def __init__(self, missing: list[str], timeout_s: float) -> None:
        self.missing = missing
        super().__init__(f"barrier: no ready mark from {', '.join(missing)} after {timeout_s:g}s")


def mark_ready(folder: Path, task: str, retry_id: int) -> Path:
    """Write this task's ready mark and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    mark = folder / f"{task}.ready"
    partial = folder / f".{task}.ready.{os.getpid()}"
    partial.write_text(json.dumps({"task": task, "retry_id": retry_id, "time_s": time.time()}))
    partial.replace(mark)
    return mark


def _missing(folder: Path, tasks: list[str]) -> list[str]:
    return [t for t in tasks if not (folder / f"{t}.ready").exists()]


def wait_for_group(
    barrier: Barrier, task: str, retry_id: int, stop: threading.Event | None = None
) -> bool:
    """Mark ``task`` ready and wait until every task of ``barrier.tasks`` is.

    Returns:
        True when all are ready; False when ``stop`` was set while waiting.

    Raises:
        BarrierTimeout: ``barrier.timeout_s`` passed first.
    """
    folder = Path(str(barrier.folder))
    mark_ready(folder, task, retry_id)
    deadline = time.monotonic() + barrier.timeout_s
    stop = stop or threading.Event()
    interval_s = min(FIRST_POLL_S, barrier.poll_interval_s)
    while missing := _missing(folder, barrier.tasks):
        if time.monotonic() >= deadline:
            raise BarrierTimeout(missing, barrier.timeout_s)
        if stop.wait(interval_s):
            return False
        interval_s = min(interval_s * 1.5, barrier.poll_interval_s)
    return True
