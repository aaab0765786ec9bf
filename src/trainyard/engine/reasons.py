"""Why a workflow failed and why its groups wait, as data.

The state machine keeps each failed attempt's ``failure_reason`` (the runner's or backend's
words, else ``exit_reason`` of its exit code) and ``log_tail`` (its last lines, read by the
reconciler with ``read_log_tail`` when the attempt ended); the scheduler's one-line waiting
reason of a SCHEDULING gang lands in ``GroupState.waiting_reason``, and so does the backend's
(``Backend.waiting_reason``: a Slurm job's pending reason) for a placed gang whose job waits
in the backend's own queue. All of it is stored with
the workflow's state, so ``query``, ``--wait``, the dashboard and ``-f json`` read one truth.
This module turns that state into what they show: ``failure_of`` (the task that failed the
workflow) and ``waits_of`` (each group not started yet, and why).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from trainyard.engine.machine import GroupState, TaskState, WorkflowState
from trainyard.status import ExitCode, Status

__all__ = [
    "LOG_TAIL_LINES",
    "LOG_TAIL_LINE_CHARS",
    "exit_reason",
    "read_log_tail",
    "failure_of",
    "waits_of",
]

LOG_TAIL_LINES = 10
"""The most log lines a failed attempt keeps in the store."""
LOG_TAIL_LINE_CHARS = 300
"""The most characters of one kept line (a longer one ends with ``...``)."""
_TAIL_READ_BYTES = 64 * 1024
"""How much of the end of ``task.log`` is read to find the last lines."""

_SERVICE_REASONS: dict[int, str] = {
    ExitCode.INIT_FAILURE: "the task's runner failed to initialise",
    ExitCode.UNKNOWN_RUNTIME: "the runner failed while the task ran",
    ExitCode.DOWNLOAD_FAILED: "downloading an input failed",
    ExitCode.MOUNT_FAILED: "mounting an input failed",
    ExitCode.UPLOAD_FAILED: "uploading an output failed",
    ExitCode.SERVICE_MESSAGES_FAILED: "the runner could not write the task's log",
    ExitCode.BARRIER_FAILED: "the gang's barrier failed (a peer never arrived)",
    ExitCode.UPSTREAM_FAILED: "an upstream group failed",
    ExitCode.BACKEND_ERROR: "the backend lost the task",
    ExitCode.SERVER_ERROR: "the server failed the task",
    ExitCode.START_ERROR: "the backend could not start the task",
    ExitCode.EVICTED: "the task was evicted",
    ExitCode.START_TIMEOUT: "the task did not start in time",
    ExitCode.PREEMPTED: "the task was preempted",
}


def exit_reason(exit_code: int) -> str:
    """A one-line reason for an attempt that failed with ``exit_code`` and said nothing
    itself (OSMO "Exit codes": 0-255 are the command's; 128+N is signal N, as a shell says).

    >>> exit_reason(1)
    'the command exited with code 1'
    >>> exit_reason(137)
    'the command was killed by SIGKILL (exit code 137)'
    """
    if exit_code in _SERVICE_REASONS:
        return f"{_SERVICE_REASONS[exit_code]} (exit code {exit_code})"
    if 128 < exit_code < 128 + 65:
        try:
            name = signal.Signals(exit_code - 128).name
        except ValueError:
            name = f"signal {exit_code - 128}"
        return f"the command was killed by {name} (exit code {exit_code})"
    return f"the command exited with code {exit_code}"


def _cut(text: str) -> str:
    if len(text) <= LOG_TAIL_LINE_CHARS:
        return text
    return text[: LOG_TAIL_LINE_CHARS - 3] + "..."


def read_log_tail(path: Path, task: str, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
    """The last ``lines`` lines that ``task``'s command printed in ``path`` (a runner's
    ``task.log``), without their time and tag, each cut to ``LOG_TAIL_LINE_CHARS``; the
    runner's own lines when the command printed none (a failed download says why there).
    Reads at most the file's last 64 KiB. A missing or unreadable file gives ``()``:
    a reason is never worth failing an engine step for."""
    from trainyard.runner.report import parse_line

    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _TAIL_READ_BYTES))
            data = handle.read(_TAIL_READ_BYTES)
    except OSError:
        return ()
    raw = data.decode("utf-8", "replace").splitlines()[1 if size > _TAIL_READ_BYTES else 0 :]
    parts = [parse_line(line, task) for line in raw if line.strip()]
    own = [p.text for p in parts if p.source == "task"] or [p.text for p in parts]
    return tuple(_cut(text) for text in own[-lines:])


def _caused_failure(task: TaskState) -> bool:
    """A task that failed of itself: not stopped because an upstream group, a cancel or a
    sibling ended its gang (those have no exit code of their own, or 3000)."""
    if not task.status.is_failed() or task.status is Status.FAILED_CANCELED:
        return False
    return task.status is not Status.FAILED_UPSTREAM and (
        task.exit_code is not None
        or task.status in (Status.FAILED_EXEC_TIMEOUT, Status.FAILED_QUEUE_TIMEOUT)
    )


def failure_of(state: WorkflowState) -> dict[str, Any] | None:
    """The task that failed ``state``'s workflow, or None while it runs, when it completed,
    or when nothing failed of itself (a cancel: its reason is the cancel).

    Returns:
        ``{"task", "group", "retry_id", "status", "exit_code", "reason", "log_tail": [..],
        "end_time_s"}`` of the earliest-ending task that failed of itself (a lead first
        when several ended at once); ``reason`` is never empty.
    """
    if not state.status.is_terminal() or state.status.value == "COMPLETED":
        return None
    failed = [t for t in state.tasks.values() if _caused_failure(t)]
    if not failed:
        return None
    first = min(failed, key=lambda t: (t.end_time_s or 0.0, not t.lead, t.name))
    reason = first.failure_reason or _status_reason(first)
    return {
        "task": first.name,
        "group": first.group,
        "retry_id": first.retry_id,
        "status": first.status.value,
        "exit_code": first.exit_code,
        "reason": reason,
        "log_tail": list(first.log_tail),
        "end_time_s": first.end_time_s,
    }


def _status_reason(task: TaskState) -> str:
    if task.status is Status.FAILED_EXEC_TIMEOUT:
        return "it ran longer than the workflow's exec_timeout"
    if task.status is Status.FAILED_QUEUE_TIMEOUT:
        return "it waited longer than the workflow's queue_timeout"
    return exit_reason(task.exit_code) if task.exit_code is not None else task.status.value


def _upstream_reason(state: WorkflowState, group: GroupState) -> str:
    pending = [
        state.groups[u]
        for u in sorted(group.upstream)
        if state.groups[u].status is not Status.COMPLETED
    ]
    named = ", ".join(f"{g.name} ({g.status.value})" for g in pending[:3])
    more = f" and {len(pending) - 3} more" if len(pending) > 3 else ""
    return f"waits for group{'s' if len(pending) > 1 else ''} {named}{more} to complete"


def waits_of(state: WorkflowState) -> list[dict[str, Any]]:
    """Each group of ``state`` that waits to start, and why, in spec order.

    Returns:
        ``[{"group", "status", "reason", "since_s"}]``: WAITING groups wait for their
        upstream groups (named with their statuses); SCHEDULING ones for nodes, with the
        scheduler's stored reason (``waiting for the scheduler`` until it gave one);
        INITIALIZING ones that the backend's own scheduler has not placed yet, with its
        words (a Kubernetes pod's Unschedulable message), only while there are some.
        Empty once the workflow ended.
    """
    if state.status.is_terminal():
        return []
    out: list[dict[str, Any]] = []
    for group in state.groups.values():
        if group.status is Status.WAITING and group.upstream:
            out.append(
                {
                    "group": group.name,
                    "status": group.status.value,
                    "reason": _upstream_reason(state, group),
                    "since_s": None,
                }
            )
        elif group.status is Status.SCHEDULING:
            out.append(
                {
                    "group": group.name,
                    "status": group.status.value,
                    "reason": group.waiting_reason or "waiting for the scheduler",
                    "since_s": group.scheduling_since_s,
                }
            )
        elif group.status is Status.INITIALIZING and group.waiting_reason:
            out.append(
                {
                    "group": group.name,
                    "status": group.status.value,
                    "reason": group.waiting_reason,
                    "since_s": group.scheduling_since_s,
                }
            )
    return out
