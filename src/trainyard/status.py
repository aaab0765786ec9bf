"""Statuses of workflows, groups and tasks, and OSMO's service exit codes.

The names are OSMO's (docs: "Workflow lifecycle", "Group lifecycle", "Task statuses",
"Exit codes"). Only the engine's state machine moves an object from one status to another;
backends report facts, never statuses.
"""

from __future__ import annotations

import signal
from enum import IntEnum, StrEnum

__all__ = [
    "Status",
    "WorkflowStatus",
    "ExitCode",
    "TERMINAL",
    "FAILED_STATUSES",
    "STOPPED_EXIT_CODE",
]


class Status(StrEnum):
    """Status of a group or a task (OSMO's names)."""

    SUBMITTING = "SUBMITTING"
    PENDING = "PENDING"
    WAITING = "WAITING"
    PROCESSING = "PROCESSING"
    SCHEDULING = "SCHEDULING"
    INITIALIZING = "INITIALIZING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    RESCHEDULED = "RESCHEDULED"
    FAILED = "FAILED"
    FAILED_CANCELED = "FAILED_CANCELED"
    FAILED_SERVER_ERROR = "FAILED_SERVER_ERROR"
    FAILED_BACKEND_ERROR = "FAILED_BACKEND_ERROR"
    FAILED_EXEC_TIMEOUT = "FAILED_EXEC_TIMEOUT"
    FAILED_QUEUE_TIMEOUT = "FAILED_QUEUE_TIMEOUT"
    FAILED_UPSTREAM = "FAILED_UPSTREAM"
    FAILED_EVICTED = "FAILED_EVICTED"
    FAILED_START_ERROR = "FAILED_START_ERROR"
    FAILED_IMAGE_PULL = "FAILED_IMAGE_PULL"
    """The task's image could not be found or pulled (the backend's fact ``IMAGE_PULL``)."""
    FAILED_START_TIMEOUT = "FAILED_START_TIMEOUT"
    FAILED_PREEMPTED = "FAILED_PREEMPTED"

    def is_terminal(self) -> bool:
        """True when nothing more can happen to the object (COMPLETED, RESCHEDULED, FAILED*)."""
        return self in TERMINAL

    def is_failed(self) -> bool:
        """True for every FAILED* status."""
        return self in FAILED_STATUSES


class WorkflowStatus(StrEnum):
    """Status of a whole workflow (OSMO docs, "Workflow lifecycle")."""

    PENDING = "PENDING"
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    FAILED_SUBMISSION = "FAILED_SUBMISSION"
    FAILED_SERVER_ERROR = "FAILED_SERVER_ERROR"
    FAILED_EXEC_TIMEOUT = "FAILED_EXEC_TIMEOUT"
    FAILED_QUEUE_TIMEOUT = "FAILED_QUEUE_TIMEOUT"
    FAILED_CANCELED = "FAILED_CANCELED"

    def is_terminal(self) -> bool:
        """True for COMPLETED and every FAILED* status."""
        return self is WorkflowStatus.COMPLETED or self.value.startswith("FAILED")


FAILED_STATUSES = frozenset(s for s in Status if s.value.startswith("FAILED"))
TERMINAL = FAILED_STATUSES | {Status.COMPLETED, Status.RESCHEDULED}


class ExitCode(IntEnum):
    """OSMO's service exit codes (docs: "Exit codes"); 0-255 belong to the user's command."""

    INIT_FAILURE = 256
    UNKNOWN_RUNTIME = 2002
    DOWNLOAD_FAILED = 2010
    MOUNT_FAILED = 2011
    UPLOAD_FAILED = 2012
    SERVICE_MESSAGES_FAILED = 2022
    """OSMO: its sidecar could not send messages (the task's logs) to the service; trainyard:
    the runner could not write the task's log (disk full)."""
    BARRIER_FAILED = 2024
    UPSTREAM_FAILED = 3000
    BACKEND_ERROR = 3001
    SERVER_ERROR = 3002
    START_ERROR = 3003
    EVICTED = 3004
    START_TIMEOUT = 3005
    PREEMPTED = 3006
    UNKNOWN = 4000


STOPPED_EXIT_CODE = 128 + signal.SIGTERM
"""What an attempt stopped on purpose (cancel, preemption) reports: a command killed by SIGTERM."""
