"""What the engine keeps of each workflow it drives, and how a backend's fact becomes an event.

Shared by the engine's phases (``core``, ``actions``, ``recovery``, ``steploop``,
``reconciler``); see docs/engine.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainyard.backends.base import FactKind, TaskFact, TaskKey
from trainyard.engine import machine as m
from trainyard.engine.scheduler import PRIORITY_RANK, priority_rank
from trainyard.spec.models import WorkflowSpec
from trainyard.status import ExitCode, Status

__all__ = [
    "DeferredStart",
    "LiveWorkflow",
    "RETRY_START_WAIT_S",
    "UnstartedStart",
    "fact_to_event",
    "rank_of",
    "still_to_start",
]

RETRY_START_WAIT_S = 120.0
"""The longest a retry's start waits for its stopped earlier attempts to end."""


def rank_of(source: dict[str, Any]) -> int:
    """The priority rank of a workflow from what its record keeps: the ``priority`` of the
    request it was submitted with (``server`` stores it there), NORMAL when none."""
    request = source.get("request") if isinstance(source, dict) else None
    return priority_rank(request.get("priority") if isinstance(request, dict) else None)


@dataclass
class LiveWorkflow:
    """An unfinished workflow the engine is driving."""

    state: m.WorkflowState
    spec: WorkflowSpec
    pool: str
    user: str | None = None
    rank: int = PRIORITY_RANK["NORMAL"]
    """Its priority's rank (``scheduler.PRIORITY_RANK``): where its gangs queue."""


@dataclass(frozen=True)
class UnstartedStart:
    """A start the killed engine stored but never made: ``action`` is the gang's start as it
    was asked (for its barrier), ``keys`` the attempts of it that must still be started."""

    workflow_id: str
    action: m.StartTasks
    keys: frozenset[TaskKey]


@dataclass
class DeferredStart:
    """A retry's start held until ``waiting`` (stopped earlier attempts) have ended; only
    the attempts ``only`` of it when given (a start that a killed engine had made in part)."""

    workflow_id: str
    action: m.StartTasks
    waiting: set[TaskKey]
    deadline: float  # time.monotonic()
    only: frozenset[TaskKey] | None = None


def fact_to_event(fact: TaskFact, tail: Callable[[], tuple[str, ...]] = tuple) -> m.Event:
    """The state machine's event for ``fact``; ``tail()`` gives the attempt's last log lines,
    read only for an attempt that was lost or exited with a code other than 0."""
    key, t = fact.key, fact.time_s
    if fact.kind is FactKind.INITIALIZING:
        return m.TaskInitializing(t, key.task, key.retry_id)
    if fact.kind is FactKind.RUNNING:
        return m.TaskRunning(t, key.task, key.retry_id)
    if fact.kind is FactKind.LOST:
        return m.TaskLost(t, key.task, key.retry_id, fact.message, log_tail=tail())
    code = fact.exit_code if fact.kind is FactKind.EXITED else int(ExitCode.START_ERROR)
    code = int(code if code is not None else ExitCode.UNKNOWN)
    return m.TaskExited(
        t,
        key.task,
        key.retry_id,
        code,
        fact.message,
        fact.failure,
        log_tail=tail() if code != 0 else (),
    )


def still_to_start(state: m.WorkflowState, key: TaskKey) -> bool:
    """Whether ``key`` is still its task's current attempt, waiting to start (not cancelled
    or ended since the restart)."""
    task = state.tasks[key.task]
    return task.retry_id == key.retry_id and task.status is Status.INITIALIZING
