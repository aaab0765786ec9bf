"""The shapes of the REST answers that the CLI reads, shared by the server (which builds them,
``server.service``) and the CLI (which reads them). TypedDicts only: importing this module
costs the CLI nothing (no pydantic, no FastAPI). Times are ISO 8601 UTC strings or None.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

__all__ = [
    "WorkflowSummary",
    "WorkflowAnswer",
    "GroupAnswer",
    "TaskAnswer",
    "AttemptAnswer",
    "FailureAnswer",
    "WaitAnswer",
]


class WorkflowSummary(TypedDict):
    """One row of ``GET /api/workflow`` (``workflow list``); the head of every workflow answer."""

    id: str
    name: str
    status: str  #: a ``WorkflowStatus`` value
    pool: str
    submitted_by: str
    labels: dict[str, str]
    submit_time: str | None
    end_time: str | None


class AttemptAnswer(TypedDict):
    """One earlier attempt of a task (``retries``, with ``?verbose=true``)."""

    retry_id: int
    status: str  #: a ``Status`` value
    exit_code: int | None
    node: str | None
    start_time: str | None
    end_time: str | None
    failure_reason: str | None
    log_tail: list[str]


class TaskAnswer(AttemptAnswer):
    """A task's current attempt; ``output_dir`` and ``outputs`` where the server adds them."""

    name: str
    lead: bool
    retries: NotRequired[list[AttemptAnswer]]
    output_dir: NotRequired[str]  #: the attempt's ``{{output}}`` folder on the server's host
    outputs: NotRequired[list[str]]  #: where the task's outputs go (URLs, dataset names)
    isolation: NotRequired[list[str]]  #: how the attempt is isolated (``?isolation=true``)


class GroupAnswer(TypedDict):
    """A group of the workflow, its tasks in spec order."""

    name: str
    status: str
    tasks: list[TaskAnswer]


class FailureAnswer(TypedDict):
    """Why the workflow failed: the first task that failed it (``engine.reasons``)."""

    task: str
    group: str
    retry_id: int
    status: str
    exit_code: int | None
    reason: str | None
    log_tail: list[str]
    end_time: str | None


class WaitAnswer(TypedDict):
    """A group that waits to start, and why (``engine.reasons.waits_of``)."""

    group: str
    status: str
    reason: str
    since: str | None


class WorkflowAnswer(WorkflowSummary):
    """``GET /api/workflow/{id}`` (``workflow query``): the summary with the groups, the
    failure (None unless it failed), the waiting groups, its priority and tags."""

    groups: list[GroupAnswer]
    failure: FailureAnswer | None
    waiting: list[WaitAnswer]
    priority: NotRequired[str]
    tags: NotRequired[list[str]]
