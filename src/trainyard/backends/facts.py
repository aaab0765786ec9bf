"""Reading a task runner's ``events.jsonl`` as backend facts; every backend whose run folders
it can read (local, Slurm on a shared filesystem) reports facts the same way."""

from __future__ import annotations

from pathlib import Path

from trainyard.backends.base import FactKind, TaskFact, TaskKey
from trainyard.runner.report import EVENTS, read_events

__all__ = ["read_facts", "ENDING"]

_KNOWN = {k.value for k in FactKind}
ENDING = frozenset({FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR})
"""Facts after which nothing more is reported for an attempt."""


def read_facts(key: TaskKey, run_dir: Path, offset: int = 0) -> tuple[list[TaskFact], int]:
    """Facts from the events ``run_dir/events.jsonl`` got after byte ``offset``.

    Returns:
        (facts in file order, new offset). Unknown event kinds are skipped; a partly written
        last line waits for the next call.
    """
    events, offset = read_events(run_dir / EVENTS, offset)
    facts = [
        TaskFact(key, FactKind(e.kind), e.time_s, e.exit_code, e.message, e.failure)
        for e in events
        if e.kind in _KNOWN
    ]
    return facts, offset
