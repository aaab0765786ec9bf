"""The pure state machine's vocabulary: task, group and workflow states, events, actions.

``engine.rules.transition(state, event) -> (state, actions)`` applies the rules to them. No
I/O, no clock, no randomness: the reconciler feeds it events (with their time) and carries
out the actions it returns.

Sources: OSMO docs, "Workflow lifecycle", "Group lifecycle", "Lead task",
"ignoreNonleadStatus", "Exit actions", "Timeouts", "Exit codes".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainyard.spec.models import ExitAction
from trainyard.status import Status, WorkflowStatus

__all__ = [
    "TaskState",
    "TaskAttempt",
    "GroupState",
    "WorkflowState",
    "Event",
    "Submitted",
    "GroupPlaced",
    "GroupStartFailed",
    "GroupWaiting",
    "TaskInitializing",
    "TaskRunning",
    "TaskExited",
    "TaskLost",
    "Tick",
    "Restarted",
    "CancelRequested",
    "Action",
    "RequestPlacement",
    "StartTasks",
    "StopTasks",
    "ReleaseGroup",
    "WorkflowFinished",
]


# --------------------------------------------------------------------------- state


@dataclass
class TaskState:
    """The current attempt of one task. Earlier attempts live in ``history``."""

    name: str
    group: str
    lead: bool
    exit_actions: dict[ExitAction, frozenset[int]] = field(default_factory=dict)
    status: Status = Status.PENDING
    retry_id: int = 0
    retries_used: int = 0
    exit_code: int | None = None
    node: str | None = None
    gpu_slots: tuple[int, ...] = ()
    start_time_s: float | None = None
    end_time_s: float | None = None
    history: list[TaskAttempt] = field(default_factory=list)
    failure_reason: str | None = None  # why the attempt failed, as its runner or backend said
    log_tail: tuple[str, ...] = ()  # a failed attempt's last log lines (bounded: reasons.py)


@dataclass(frozen=True)
class TaskAttempt:
    """A finished earlier attempt of a task (for ``query --verbose`` and logs)."""

    retry_id: int
    status: Status
    exit_code: int | None
    node: str | None
    start_time_s: float | None
    end_time_s: float | None
    failure_reason: str | None = None
    log_tail: tuple[str, ...] = ()


@dataclass
class GroupState:
    """One gang. ``upstream`` are the groups whose tasks feed this group's inputs."""

    name: str
    tasks: list[str]
    upstream: frozenset[str] = frozenset()
    barrier: bool = True
    ignore_nonlead_status: bool = True
    status: Status = Status.PENDING
    scheduling_since_s: float | None = None
    running_since_s: float | None = None
    end_time_s: float | None = None
    waiting_reason: str | None = None  # why a gang is not placed yet (scheduler or backend's)


@dataclass
class WorkflowState:
    """Everything the state machine knows about one workflow."""

    id: str
    groups: dict[str, GroupState]
    tasks: dict[str, TaskState]
    status: WorkflowStatus = WorkflowStatus.PENDING
    exec_timeout_s: float | None = None
    queue_timeout_s: float | None = None
    max_retries: int = 3
    submit_time_s: float | None = None
    end_time_s: float | None = None
    cancel_requested: bool = False


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Event:
    """Something that happened, at ``time_s`` (Unix seconds)."""

    time_s: float


@dataclass(frozen=True)
class Submitted(Event):
    """The workflow was accepted and stored."""


@dataclass(frozen=True)
class GroupPlaced(Event):
    """The scheduler fit the whole gang: ``nodes`` maps each task to its node."""

    group: str
    nodes: dict[str, str]
    gpu_slots: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupStartFailed(Event):
    """The backend refused to start the group (FAILED_START_ERROR / FAILED_BACKEND_ERROR)."""

    group: str
    message: str = ""
    backend_error: bool = False


@dataclass(frozen=True)
class TaskInitializing(Event):
    task: str
    retry_id: int


@dataclass(frozen=True)
class TaskRunning(Event):
    task: str
    retry_id: int


@dataclass(frozen=True)
class TaskExited(Event):
    task: str
    retry_id: int
    exit_code: int
    message: str = ""  # why, when it failed (the runner's or the backend's words)
    failure: str | None = None  # a kind of failure the backend saw (IMAGE_PULL), else None
    log_tail: tuple[str, ...] = ()  # the attempt's last log lines, read when it failed


@dataclass(frozen=True)
class TaskLost(Event):
    """The attempt vanished without an exit code (treated as backend error 3001)."""

    task: str
    retry_id: int
    message: str = ""  # what the backend saw
    log_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupWaiting(Event):
    """The scheduler could not place a SCHEDULING gang yet; ``reason`` says why in one line
    (what it needs, what is free, what it waits behind: ``Scheduler.waiting_reasons``). Or
    the backend's own scheduler has not placed a started gang's tasks yet
    (``Backend.waiting_reason``: a Kubernetes pod Unschedulable); "" once it has."""

    group: str
    reason: str


@dataclass(frozen=True)
class Restarted(Event):
    """The user restarted a failed workflow: its groups that did not complete run again
    with new attempts; completed groups and their outputs are kept."""


@dataclass(frozen=True)
class Tick(Event):
    """Time passed: check queue and exec timeouts."""


@dataclass(frozen=True)
class CancelRequested(Event):
    """The user cancelled the workflow."""


# --------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Action:
    """Something the reconciler must do."""


@dataclass(frozen=True)
class RequestPlacement(Action):
    """Ask the scheduler to place the whole gang (then feed GroupPlaced back)."""

    group: str


@dataclass(frozen=True)
class StartTasks(Action):
    """Start these (task, retry_id) attempts of ``group`` on the nodes in the state."""

    group: str
    tasks: tuple[tuple[str, int], ...]
    restart_in_place: bool = False


@dataclass(frozen=True)
class StopTasks(Action):
    """Stop these (task, retry_id) attempts with their process trees; ``reason`` (when
    given) is why, as the store keeps it (e.g. ``LEAD_FINISHED``), said in their logs."""

    tasks: tuple[tuple[str, int], ...]
    reason: str | None = None


@dataclass(frozen=True)
class ReleaseGroup(Action):
    """The group ended: give its nodes back to the pool."""

    group: str


@dataclass(frozen=True)
class WorkflowFinished(Action):
    """The workflow reached a terminal status."""

    status: WorkflowStatus
