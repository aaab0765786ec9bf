"""The status rules of trainyard: the body of ``machine.transition``.

``transition(state, event)`` applies one event to a copy of ``state`` (copy-on-read: only
the tasks and groups the event touches are copied) and returns it with the actions the
reconciler must carry out. No clock (time comes with the event), no
I/O, no randomness. Every status move is checked against the allowed-transitions tables below
(STYLE.md #4); an illegal move is a bug and raises ``IllegalTransition``.

Sources (OSMO docs): "Workflow lifecycle", "Group lifecycle" (``ignoreNonleadStatus``),
"Lead task", "Exit actions", "Exit codes", "Timeouts".
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainyard.engine.machine import (
    Action,
    CancelRequested,
    Event,
    GroupPlaced,
    GroupStartFailed,
    GroupState,
    GroupWaiting,
    ReleaseGroup,
    RequestPlacement,
    Restarted,
    StartTasks,
    StopTasks,
    Submitted,
    TaskAttempt,
    TaskExited,
    TaskInitializing,
    TaskLost,
    TaskRunning,
    TaskState,
    Tick,
    WorkflowFinished,
    WorkflowState,
)
from trainyard.engine.reasons import exit_reason
from trainyard.errors import NotFoundError
from trainyard.spec.models import ExitAction
from trainyard.status import ExitCode, Status, WorkflowStatus

__all__ = [
    "LEAD_FINISHED",
    "IMAGE_PULL",
    "TASK_TRANSITIONS",
    "GROUP_TRANSITIONS",
    "WORKFLOW_TRANSITIONS",
    "IllegalTransition",
    "check_move",
    "action_for",
    "failure_status",
    "workflow_status",
    "transition",
]

S = Status
W = WorkflowStatus

# --------------------------------------------------------------------------- tables

#: Statuses a task or group may fail with once its command has started (exit codes 1-255 give
#: FAILED; OSMO's service exit codes >= 3001 name their own status, see ``failure_status``).
EXIT_FAILURES = frozenset(
    {
        S.FAILED,
        S.FAILED_BACKEND_ERROR,
        S.FAILED_SERVER_ERROR,
        S.FAILED_START_ERROR,
        S.FAILED_IMAGE_PULL,
        S.FAILED_EVICTED,
        S.FAILED_START_TIMEOUT,
        S.FAILED_PREEMPTED,
    }
)
_ENDED_WHILE_STARTED = EXIT_FAILURES | {S.COMPLETED, S.FAILED_EXEC_TIMEOUT, S.FAILED_CANCELED}
_NOT_YET_SCHEDULED = frozenset({S.WAITING, S.SCHEDULING, S.FAILED_CANCELED, S.FAILED_UPSTREAM})
_SCHEDULING_NEXT = frozenset(
    {
        S.INITIALIZING,
        S.FAILED_QUEUE_TIMEOUT,
        S.FAILED_START_ERROR,
        S.FAILED_BACKEND_ERROR,
        S.FAILED_CANCELED,
    }
)

#: Task attempt: status -> statuses it may move to. A retried attempt ends RESCHEDULED (in
#: ``history``) and the task's next attempt starts at INITIALIZING on the same node.
TASK_TRANSITIONS: dict[Status, frozenset[Status]] = {
    S.PENDING: _NOT_YET_SCHEDULED,
    S.WAITING: _NOT_YET_SCHEDULED - {S.WAITING},
    S.SCHEDULING: _SCHEDULING_NEXT,
    S.INITIALIZING: _ENDED_WHILE_STARTED | {S.RUNNING, S.RESCHEDULED, S.FAILED_QUEUE_TIMEOUT},
    S.RUNNING: _ENDED_WHILE_STARTED | {S.RESCHEDULED},
}

#: Group (gang): status -> statuses it may move to. A group is never RESCHEDULED: its tasks
#: are, and the group stays where it was (OSMO: "the group status stays at RUNNING").
GROUP_TRANSITIONS: dict[Status, frozenset[Status]] = {
    S.PENDING: _NOT_YET_SCHEDULED,
    S.WAITING: _NOT_YET_SCHEDULED - {S.WAITING},
    S.SCHEDULING: _SCHEDULING_NEXT,
    S.INITIALIZING: _ENDED_WHILE_STARTED | {S.RUNNING, S.FAILED_QUEUE_TIMEOUT},
    S.RUNNING: _ENDED_WHILE_STARTED,
}

_WORKFLOW_ENDS = frozenset(s for s in W if s.is_terminal()) - {W.FAILED_SUBMISSION}

#: Workflow: status -> statuses it may move to (OSMO "Workflow lifecycle": PENDING until a
#: group runs, RUNNING while one runs, WAITING between groups, then COMPLETED or FAILED*).
WORKFLOW_TRANSITIONS: dict[WorkflowStatus, frozenset[WorkflowStatus]] = {
    W.PENDING: _WORKFLOW_ENDS | {W.RUNNING},
    W.RUNNING: _WORKFLOW_ENDS | {W.WAITING},
    W.WAITING: _WORKFLOW_ENDS | {W.RUNNING},
}

_STARTED = frozenset({S.INITIALIZING, S.RUNNING})  # an attempt the backend was asked to start

IMAGE_PULL = "IMAGE_PULL"
"""``TaskExited.failure`` of an attempt whose image could not be found or pulled."""

LEAD_FINISHED = "Lead task finished"
"""OSMO's reason for the tasks of a group stopped because its lead task ended: kept as their
``failure_reason`` (whatever their status), so every view says the same."""
_GROUP_ACTIVE = _STARTED  # a group holding nodes; the workflow is RUNNING while one is
_PLACEMENT_ASKED = frozenset({S.SCHEDULING}) | _STARTED  # ReleaseGroup when such a group ends


class IllegalTransition(RuntimeError):
    """A status move that the transition tables forbid: a bug in the rules, never user error."""


def check_move(kind: str, name: str, old: Any, new: Any, table: dict[Any, frozenset[Any]]) -> None:
    """Raise IllegalTransition unless ``old -> new`` is in ``table`` (staying put is allowed).

    Args:
        kind: ``task``, ``group`` or ``workflow`` (for the message).
        name: the object's name (for the message).
    """
    if new != old and new not in table.get(old, frozenset()):
        allowed = sorted(str(s) for s in table.get(old, frozenset())) or "nothing (terminal)"
        raise IllegalTransition(
            f"{kind} {name!r}: {old} -> {new} is not allowed; {old} -> {allowed}"
        )


# --------------------------------------------------------------------------- exit codes


def action_for(task: TaskState, exit_code: int) -> ExitAction:
    """The exit action for ``exit_code`` (OSMO "Exit actions").

    The task's exit actions (its spec's ``exitActions``, codes 0-255, then its pool's
    ``default_exit_actions``, which may name OSMO's service codes: 2010 download, 3001
    backend error, 3005 start timeout, ...; ``plan.build_state`` merged them), else
    0 -> COMPLETE and anything else -> FAIL (OSMO ``UpdateGroup._apply_exit_action``).
    """
    for action, codes in task.exit_actions.items():
        if exit_code in codes:
            return action
    return ExitAction.COMPLETE if exit_code == 0 else ExitAction.FAIL


_SERVICE_FAILURES: dict[int, Status] = {
    ExitCode.BACKEND_ERROR: S.FAILED_BACKEND_ERROR,
    ExitCode.SERVER_ERROR: S.FAILED_SERVER_ERROR,
    ExitCode.START_ERROR: S.FAILED_START_ERROR,
    ExitCode.EVICTED: S.FAILED_EVICTED,
    ExitCode.START_TIMEOUT: S.FAILED_START_TIMEOUT,
    ExitCode.PREEMPTED: S.FAILED_PREEMPTED,
}


def failure_status(exit_code: int) -> Status:
    """The status of an attempt that FAILs with ``exit_code`` (OSMO "Exit codes"): the
    service codes 3001-3006 name their status, every other code gives FAILED."""
    return _SERVICE_FAILURES.get(exit_code, S.FAILED)


# --------------------------------------------------------------------------- one step


class _CopyOnRead(dict):  # type: ignore[type-arg]
    """A shallow copy of ``{name: TaskState | GroupState}`` whose values are copied the first
    time they are read with ``[]``, ``values()`` or ``items()``, so one event costs what it
    touches, not the size of the workflow. ``dict(x)`` gives the plain dict back (copies where
    made, the originals elsewhere); ``dict.values(x)`` reads without copying."""

    def __init__(self, original: dict[str, Any]) -> None:
        super().__init__(original)
        self._copied: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        if key not in self._copied:
            dict.__setitem__(self, key, _copy_object(dict.__getitem__(self, key)))
            self._copied.add(key)
        return dict.__getitem__(self, key)

    def values(self) -> Any:
        return [self[key] for key in self]

    def items(self) -> Any:
        return [(key, self[key]) for key in self]


def _copy_object(value: Any) -> Any:
    """A copy of a task or group that the rules may change (a task's history list too)."""
    new = copy.copy(value)
    if isinstance(new, TaskState):
        new.history = list(new.history)
    return new


def _cow_state(state: WorkflowState) -> WorkflowState:
    new = copy.copy(state)
    new.groups = _CopyOnRead(state.groups)
    new.tasks = _CopyOnRead(state.tasks)
    return new


def _plain_state(state: WorkflowState) -> WorkflowState:
    state.groups = dict(state.groups)
    state.tasks = dict(state.tasks)
    return state


def _peek(objects: dict[str, Any]) -> Any:
    """The values of a state's dict, read-only and without copying."""
    return dict.values(objects)


@dataclass
class _Step:
    """The copy being changed by one event, the event's time and the actions so far."""

    state: WorkflowState
    now_s: float
    actions: list[Action] = field(default_factory=list)

    def emit(self, action: Action) -> None:
        self.actions.append(action)

    def task(self, name: str) -> TaskState:
        if name not in self.state.tasks:
            raise NotFoundError(f"workflow {self.state.id!r} has no task {name!r}")
        return self.state.tasks[name]

    def group(self, name: str) -> GroupState:
        if name not in self.state.groups:
            raise NotFoundError(f"workflow {self.state.id!r} has no group {name!r}")
        return self.state.groups[name]

    def tasks_of(self, group: GroupState) -> list[TaskState]:
        return [self.state.tasks[name] for name in group.tasks]


def _set_task(step: _Step, task: TaskState, status: Status) -> None:
    """Move ``task`` to ``status`` (checked); an ending attempt gets ``end_time_s``."""
    check_move("task", task.name, task.status, status, TASK_TRANSITIONS)
    task.status = status
    if status.is_terminal():
        task.end_time_s = step.now_s


def _set_group(step: _Step, group: GroupState, status: Status) -> None:
    """Move ``group`` to ``status`` (checked); an ending group gets ``end_time_s``."""
    check_move("group", group.name, group.status, status, GROUP_TRANSITIONS)
    group.status = status
    if status not in (S.SCHEDULING, S.INITIALIZING):
        group.waiting_reason = None  # it runs or ended: it waits no more
    if status.is_terminal():
        group.end_time_s = step.now_s


# --------------------------------------------------------------------------- groups


def _set_gang(step: _Step, group: GroupState, status: Status) -> None:
    """Move a group and every one of its tasks to ``status`` (checked)."""
    for task in step.tasks_of(group):
        _set_task(step, task, status)
    _set_group(step, group, status)


def _schedule(step: _Step, group: GroupState) -> None:
    """Group and its tasks -> SCHEDULING; ask the scheduler to place the whole gang."""
    _set_gang(step, group, S.SCHEDULING)
    group.scheduling_since_s = step.now_s
    step.emit(RequestPlacement(group.name))


def _wait(step: _Step, group: GroupState) -> None:
    """Group and its tasks -> WAITING for their upstream groups (OSMO "Group lifecycle")."""
    _set_gang(step, group, S.WAITING)


def _schedule_ready(step: _Step) -> None:
    """Every WAITING group whose upstream groups all COMPLETED starts SCHEDULING (spec order)."""
    groups = step.state.groups
    ready = [
        g.name
        for g in _peek(groups)
        if g.status is S.WAITING
        and all(dict.__getitem__(groups, u).status is S.COMPLETED for u in g.upstream)
    ]
    for name in ready:
        _schedule(step, groups[name])


def _fail_downstream(step: _Step, failed: GroupState) -> None:
    """Groups fed by ``failed`` -> FAILED_UPSTREAM with exit code 3000, transitively."""
    fed = [
        g.name
        for g in _peek(step.state.groups)
        if failed.name in g.upstream and not g.status.is_terminal()
    ]
    for name in fed:
        group = step.state.groups[name]
        if not group.status.is_terminal():  # a cascade above may have ended it already
            _end_group(step, group, S.FAILED_UPSTREAM, exit_code=ExitCode.UPSTREAM_FAILED)


def _end_tasks(
    step: _Step,
    group: GroupState,
    status: Status,
    exit_code: int | None,
    reason: str | None = None,
    announce: bool = False,
) -> None:
    """The group's unfinished tasks take ``status`` (and ``reason``, when given, as their
    ``failure_reason``); started attempts are stopped (``announce``: ``reason`` said in
    their logs too).

    A stopped task gets no exit code of its own (``exit_code`` is only set for service codes
    that OSMO assigns: 3000 upstream, 3001 backend, 3003 start error).
    """
    live = [t for t in step.tasks_of(group) if not t.status.is_terminal()]
    started = tuple((t.name, t.retry_id) for t in live if t.status in _STARTED)
    for task in live:
        if exit_code is not None:
            task.exit_code = int(exit_code)
        if reason:
            task.failure_reason = reason
        _set_task(step, task, status)
    if started:
        step.emit(StopTasks(started, reason if announce else None))


def _end_group(
    step: _Step,
    group: GroupState,
    status: Status,
    *,
    exit_code: int | None = None,
    cascade: bool = True,
    reason: str | None = None,
    announce: bool = False,
) -> None:
    """End ``group`` with ``status``: its unfinished tasks too (stopped if started),
    ReleaseGroup if a placement was asked for, then downstream groups follow (``cascade``):
    scheduled when it COMPLETED, FAILED_UPSTREAM when it failed (OSMO "Group lifecycle")."""
    asked = group.status in _PLACEMENT_ASKED
    _end_tasks(step, group, status, exit_code, reason, announce)
    _set_group(step, group, status)
    if asked:
        step.emit(ReleaseGroup(group.name))
    if cascade and status is S.COMPLETED:
        _schedule_ready(step)
    elif cascade:
        _fail_downstream(step, group)


# --------------------------------------------------------------------------- tasks


def _current(step: _Step, task_name: str, retry_id: int) -> TaskState | None:
    """The task if ``retry_id`` is its current, started attempt; None for a stale report."""
    task = step.task(task_name)
    if task.retry_id != retry_id or task.status not in _STARTED:
        return None
    return task


def _new_attempt(step: _Step, task: TaskState, exit_code: int | None) -> None:
    """Record the current attempt as RESCHEDULED in ``history`` and start the next one:
    retry id + 1, INITIALIZING on the same node, no times or exit code yet."""
    check_move("task", task.name, task.status, S.RESCHEDULED, TASK_TRANSITIONS)
    task.history.append(
        TaskAttempt(
            task.retry_id,
            S.RESCHEDULED,
            exit_code,
            task.node,
            task.start_time_s,
            step.now_s,
            task.failure_reason,
            task.log_tail,
        )
    )
    task.retry_id += 1
    task.status = S.INITIALIZING
    task.exit_code = task.start_time_s = task.end_time_s = task.failure_reason = None
    task.log_tail = ()


def _retry(
    step: _Step, task: TaskState, exit_code: int, in_place: bool, whole_gang: bool = False
) -> None:
    """RESCHEDULE (``in_place`` False) or RESTART: a new attempt of ``task``.

    With ``ignoreNonleadStatus: false``, or ``whole_gang`` (the attempt ended before its
    gang's barrier released: ``_unreleased``), the group's other started tasks are stopped
    and restarted with it (OSMO "Group lifecycle"); they get new retry ids but do not use up
    their own retries. One StartTasks holds every new attempt, in group order.
    """
    group = step.state.groups[task.group]
    task.retries_used += 1
    peers = (
        []
        if group.ignore_nonlead_status and not whole_gang
        else [t for t in step.tasks_of(group) if t is not task and t.status in _STARTED]
    )
    if peers:
        step.emit(StopTasks(tuple((t.name, t.retry_id) for t in peers)))
    _new_attempt(step, task, exit_code)
    for peer in peers:
        _new_attempt(step, peer, None)
    names = {task.name} | {t.name for t in peers}
    restarted = tuple((t.name, t.retry_id) for t in step.tasks_of(group) if t.name in names)
    step.emit(StartTasks(group.name, restarted, restart_in_place=in_place))


def _unreleased(step: _Step, task: TaskState) -> bool:
    """Whether ``task``'s attempt ends before its gang's barrier released: the group has a
    barrier and more than one task, the task never reported RUNNING, and no task of the group
    runs (RUNNING is reported only past the barrier, and a start of part of a gang has none).
    Its peers would wait at the barrier for a task that never comes, so the
    gang ends with it whatever ``ignoreNonleadStatus`` says, or is retried with it whole
    (a pool's exit action for a service code such as 3005, the gang's start timeout)."""
    group = step.state.groups[task.group]
    if not group.barrier or len(group.tasks) < 2 or task.status is not S.INITIALIZING:
        return False
    return all(dict.__getitem__(step.state.tasks, t).status is not S.RUNNING for t in group.tasks)


def _settle_group(step: _Step, task: TaskState, unreleased: bool = False) -> None:
    """After ``task`` ended: the lead's end decides the group (OSMO "Lead task"); a failed
    non-lead fails the group with ``ignoreNonleadStatus: false``, or when it failed before
    the gang's barrier released (``unreleased``: the gang never ran; OSMO fails the group at
    once)."""
    group = step.state.groups[task.group]
    nonlead_decides = not group.ignore_nonlead_status or unreleased
    if task.lead:
        _end_group(step, group, task.status, reason=LEAD_FINISHED, announce=True)
    elif task.status.is_failed() and nonlead_decides:
        _end_group(step, group, task.status)


def _task_ended(
    step: _Step,
    task: TaskState,
    exit_code: int,
    reason: str = "",
    failure: str | None = None,
    log_tail: tuple[str, ...] = (),
) -> None:
    """Apply the exit action of ``exit_code``; RESCHEDULE/RESTART past ``max_retries``
    (counted together) is a FAIL. A failed (or retried) attempt keeps ``reason`` (why, as
    its runner or backend said; else ``exit_reason`` of its code) as its ``failure_reason``
    and ``log_tail`` (its last log lines); a FAIL whose ``failure`` is ``IMAGE_PULL`` is
    FAILED_IMAGE_PULL."""
    action = action_for(task, exit_code)
    if action is not ExitAction.COMPLETE:
        task.failure_reason = reason or exit_reason(exit_code)
        task.log_tail = tuple(log_tail)
    retry = action in (ExitAction.RESCHEDULE, ExitAction.RESTART)
    unreleased = _unreleased(step, task)
    if retry and task.retries_used < step.state.max_retries:
        _retry(step, task, exit_code, in_place=action is ExitAction.RESTART, whole_gang=unreleased)
        return
    task.exit_code = int(exit_code)
    completed = action is ExitAction.COMPLETE
    failed = S.FAILED_IMAGE_PULL if failure == IMAGE_PULL else failure_status(exit_code)
    _set_task(step, task, S.COMPLETED if completed else failed)
    _settle_group(step, task, unreleased)


# --------------------------------------------------------------------------- handlers


def _on_submitted(step: _Step, event: Submitted) -> None:
    """Groups without upstream -> SCHEDULING (RequestPlacement, spec order); others WAITING.
    A second Submitted is ignored."""
    if any(g.status is not S.PENDING for g in _peek(step.state.groups)):
        return
    for group in step.state.groups.values():
        (_wait if group.upstream else _schedule)(step, group)


def _on_group_placed(step: _Step, event: GroupPlaced) -> None:
    """A SCHEDULING gang got its nodes: tasks INITIALIZING on them, StartTasks for all.

    A placement that arrives for a group that already ended (cancelled or timed out while
    queued) is handed back at once with ReleaseGroup; any other one is ignored.
    """
    group = step.group(event.group)
    if group.status.is_terminal():
        step.emit(ReleaseGroup(group.name))
    if group.status is not S.SCHEDULING:
        return
    missing = sorted(set(group.tasks) - set(event.nodes))
    if missing:
        raise ValueError(f"GroupPlaced for {group.name!r} has no node for tasks {missing}")
    for task in step.tasks_of(group):
        task.node = event.nodes[task.name]
        task.gpu_slots = tuple(event.gpu_slots.get(task.name, ()))
    group.waiting_reason = None
    _set_gang(step, group, S.INITIALIZING)
    step.emit(StartTasks(group.name, tuple((t.name, t.retry_id) for t in step.tasks_of(group))))


def _on_group_start_failed(step: _Step, event: GroupStartFailed) -> None:
    """The backend could not start the gang (or the new attempts of a retry in a RUNNING
    group): group and unfinished tasks FAILED_START_ERROR (exit code 3003), or
    FAILED_BACKEND_ERROR (3001) for a backend error; started attempts are stopped."""
    group = step.group(event.group)
    if group.status not in _PLACEMENT_ASKED:
        return
    reason = event.message or None
    if event.backend_error:
        _end_group(
            step, group, S.FAILED_BACKEND_ERROR, exit_code=ExitCode.BACKEND_ERROR, reason=reason
        )
    else:
        _end_group(step, group, S.FAILED_START_ERROR, exit_code=ExitCode.START_ERROR, reason=reason)


def _on_group_waiting(step: _Step, event: GroupWaiting) -> None:
    """The scheduler says why a SCHEDULING gang is not placed, or the backend's own
    scheduler why a placed gang's tasks do not start yet (a Kubernetes pod Unschedulable;
    the group is INITIALIZING and no task of it started): kept as its
    ``waiting_reason``; an empty reason clears it (the same reason again changes nothing,
    so nothing is stored). Ignored for a group in any other state (running or ended)."""
    group = step.group(event.group)
    if group.status is S.SCHEDULING or _queued(step.state, group):
        group.waiting_reason = event.reason or None


def _on_task_initializing(step: _Step, event: TaskInitializing) -> None:
    """The attempt's runner started: ``start_time_s`` is set (status stays INITIALIZING)."""
    task = _current(step, event.task, event.retry_id)
    if task is not None and task.start_time_s is None:
        task.start_time_s = step.now_s
        step.group(task.group).waiting_reason = None  # its runner started: no queue holds it


def _on_task_running(step: _Step, event: TaskRunning) -> None:
    """Task -> RUNNING; its group -> RUNNING on its first running task (the exec timeout
    counts from ``running_since_s``). Duplicates are ignored."""
    task = _current(step, event.task, event.retry_id)
    if task is None or task.status is S.RUNNING:
        return
    _set_task(step, task, S.RUNNING)
    task.start_time_s = step.now_s if task.start_time_s is None else task.start_time_s
    group = step.state.groups[task.group]
    if group.status is S.INITIALIZING:
        _set_group(step, group, S.RUNNING)
        group.waiting_reason = None
        group.running_since_s = step.now_s


def _on_task_exited(step: _Step, event: TaskExited) -> None:
    """The current attempt exited with ``exit_code``: apply its exit action."""
    task = _current(step, event.task, event.retry_id)
    if task is not None:
        _task_ended(step, task, event.exit_code, event.message, event.failure, event.log_tail)


def _on_task_lost(step: _Step, event: TaskLost) -> None:
    """The attempt vanished: an exit with 3001, so FAILED_BACKEND_ERROR and a FAIL."""
    task = _current(step, event.task, event.retry_id)
    if task is not None:
        _task_ended(
            step,
            task,
            int(ExitCode.BACKEND_ERROR),
            event.message or "the task vanished without reporting an exit",
            log_tail=event.log_tail,
        )


def _timed_out(since_s: float | None, limit_s: float | None, now_s: float) -> bool:
    return since_s is not None and limit_s is not None and now_s - since_s > limit_s


def _queued(state: WorkflowState, group: GroupState) -> bool:
    """True while the gang waits for nodes: SCHEDULING (trainyard's own queue), or
    INITIALIZING with no runner of the gang started yet (placed, but still in the backend's
    queue: a Slurm job PENDING for its nodes is what OSMO shows as SCHEDULING)."""
    if group.status is S.SCHEDULING:
        return True
    return group.status is S.INITIALIZING and all(
        dict.__getitem__(state.tasks, name).start_time_s is None for name in group.tasks
    )


def _timeout_of(state: WorkflowState, group: GroupState, now_s: float) -> Status | None:
    """OSMO "Timeouts", per group: queued (see ``_queued``) longer than ``queue_timeout_s``
    since it entered SCHEDULING gives FAILED_QUEUE_TIMEOUT, RUNNING longer than
    ``exec_timeout_s`` FAILED_EXEC_TIMEOUT."""
    if state.queue_timeout_s is not None and _queued(state, group):  # (every Tick: cheap first)
        late = _timed_out(group.scheduling_since_s, state.queue_timeout_s, now_s)
        return S.FAILED_QUEUE_TIMEOUT if late else None
    if group.status is S.RUNNING:
        late = _timed_out(group.running_since_s, state.exec_timeout_s, now_s)
        return S.FAILED_EXEC_TIMEOUT if late else None
    return None


def _late_groups(state: WorkflowState, now_s: float) -> list[str]:
    return [g.name for g in _peek(state.groups) if _timeout_of(state, g, now_s)]


def _timeout_reason(state: WorkflowState, group: GroupState, status: Status) -> str:
    """Why ``group`` timed out, in one line (with what it waited for, when it was known)."""
    if status is S.FAILED_EXEC_TIMEOUT:
        return f"it ran longer than exec_timeout ({state.exec_timeout_s:g} s)"
    waited = f"; it waited: {group.waiting_reason}" if group.waiting_reason else ""
    return f"it was queued longer than queue_timeout ({state.queue_timeout_s:g} s){waited}"


def _on_tick(step: _Step, event: Tick) -> None:
    """Groups past their queue or exec timeout end with it (their started tasks stopped);
    their downstream groups -> FAILED_UPSTREAM."""
    for name in _late_groups(step.state, step.now_s):
        group = step.state.groups[name]
        status = _timeout_of(step.state, group, step.now_s)
        if status is not None:
            _end_group(step, group, status, reason=_timeout_reason(step.state, group, status))


def _on_cancel(step: _Step, event: CancelRequested) -> None:
    """Every unfinished group and task -> FAILED_CANCELED; started attempts stopped,
    placements released. Idempotent."""
    step.state.cancel_requested = True
    for group in step.state.groups.values():
        if not group.status.is_terminal():
            _end_group(step, group, S.FAILED_CANCELED, cascade=False)


def _renew_task(step: _Step, task: TaskState) -> None:
    """Close the task's last attempt into ``history`` and give it a fresh one (retry id + 1,
    retries counted anew), WAITING. A restart is a new life: it bypasses the tables."""
    task.history.append(
        TaskAttempt(
            task.retry_id,
            task.status,
            task.exit_code,
            task.node,
            task.start_time_s,
            task.end_time_s,
            task.failure_reason,
            task.log_tail,
        )
    )
    task.retry_id += 1
    task.retries_used = 0
    task.status = S.WAITING
    task.exit_code = task.node = task.start_time_s = task.end_time_s = None
    task.failure_reason = None
    task.log_tail = ()
    task.gpu_slots = ()


def _on_restarted(step: _Step, event: Restarted) -> None:
    """OSMO ``workflow restart``: a failed workflow runs its groups that did not complete
    again (new attempts, WAITING, then SCHEDULING as their upstreams allow); COMPLETED groups
    and their outputs are kept. Ignored unless the workflow ended without completing."""
    state = step.state
    if not state.status.is_terminal() or state.status is W.COMPLETED:
        return
    for group in state.groups.values():
        if group.status is S.COMPLETED:
            continue
        for task in step.tasks_of(group):
            _renew_task(step, task)
        group.status = S.WAITING
        group.scheduling_since_s = group.running_since_s = group.end_time_s = None
        group.waiting_reason = None
    state.status, state.end_time_s, state.cancel_requested = W.PENDING, None, False
    _schedule_ready(step)


_HANDLERS: dict[type[Event], Callable[[_Step, Any], None]] = {
    Restarted: _on_restarted,
    Submitted: _on_submitted,
    GroupPlaced: _on_group_placed,
    GroupStartFailed: _on_group_start_failed,
    GroupWaiting: _on_group_waiting,
    TaskInitializing: _on_task_initializing,
    TaskRunning: _on_task_running,
    TaskExited: _on_task_exited,
    TaskLost: _on_task_lost,
    Tick: _on_tick,
    CancelRequested: _on_cancel,
}


# --------------------------------------------------------------------------- workflow


def _final_status(state: WorkflowState) -> WorkflowStatus:
    """Every group ended: COMPLETED if all did, else FAILED_CANCELED after a cancel, else
    FAILED_EXEC_TIMEOUT / FAILED_QUEUE_TIMEOUT if a group got one, else FAILED."""
    statuses = {g.status for g in _peek(state.groups)}
    if statuses <= {S.COMPLETED}:
        return W.COMPLETED
    if state.cancel_requested:
        return W.FAILED_CANCELED
    for timeout in (S.FAILED_EXEC_TIMEOUT, S.FAILED_QUEUE_TIMEOUT):
        if timeout in statuses:
            return W(timeout.value)
    return W.FAILED


def workflow_status(state: WorkflowState) -> WorkflowStatus:
    """OSMO "Workflow lifecycle": RUNNING while a group is INITIALIZING or RUNNING; terminal
    once every group is; otherwise PENDING until a group has run, WAITING after."""
    groups = _peek(state.groups)
    if any(g.status in _GROUP_ACTIVE for g in groups):
        return W.RUNNING
    if all(g.status.is_terminal() for g in groups):
        return _final_status(state)
    return W.PENDING if state.status is W.PENDING else W.WAITING


def _refresh_workflow(step: _Step) -> None:
    """Move the workflow to ``workflow_status``; on reaching a terminal status set
    ``end_time_s`` and emit WorkflowFinished (once: a finished workflow never moves)."""
    state = step.state
    new = workflow_status(state)
    check_move("workflow", state.id, state.status, new, WORKFLOW_TRANSITIONS)
    if new is not state.status and new.is_terminal():
        state.end_time_s = step.now_s
        step.emit(WorkflowFinished(new))
    state.status = new


def transition(state: WorkflowState, event: Event) -> tuple[WorkflowState, list[Action]]:
    """Apply ``event`` to a copy of ``state``.

    Returns:
        The new state and the actions to carry out, in order. ``state`` is never mutated;
        when the event changes nothing, ``state`` itself is returned (``new is state`` means
        "nothing to store"), so treat states as values. Stale or duplicate events (an old
        retry id, an attempt not started, a finished task or group, a second Submitted or
        cancel) change nothing and give no actions. Once the workflow finished only a late
        GroupPlaced (ReleaseGroup) and Restarted (of a failed workflow) do something.

    Raises:
        NotFoundError: the event names a task or group that the workflow lacks.
        TypeError: an event type this machine does not know.
        IllegalTransition: a bug in these rules (a move the tables forbid).
    """
    handler = _HANDLERS.get(type(event))
    if handler is None:
        raise TypeError(f"unknown event type {type(event).__name__}")
    if state.status.is_terminal() and not isinstance(event, (GroupPlaced, Restarted)):
        return state, []
    if isinstance(event, Tick) and not _late_groups(state, event.time_s):
        return state, []  # the common tick: nothing due, nothing copied
    step = _Step(_cow_state(state), event.time_s)
    handler(step, event)
    _refresh_workflow(step)
    new = _plain_state(step.state)
    return (state if new == state else new), step.actions
