"""Stored records and engine state in the JSON shapes the API answers (``answers.py``).

Pure functions: no engine, no store, no HTTP. Times are ISO 8601 UTC strings.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from trainyard.engine import machine as m
from trainyard.engine import reasons
from trainyard.errors import SpecError, SpecProblem
from trainyard.server.answers import (
    AttemptAnswer,
    EventAnswer,
    GroupAnswer,
    TaskAnswer,
    WorkflowAnswer,
    WorkflowSummary,
)
from trainyard.spec.tokens import substitute_tokens
from trainyard.store import WorkflowRecord


def iso(time_s: float | None) -> str | None:
    """Unix seconds as ISO 8601 UTC (``2026-11-22T10:00:00.123456+00:00``), None as None."""
    if time_s is None:
        return None
    return datetime.fromtimestamp(time_s, tz=UTC).isoformat()


def summary_json(record: WorkflowRecord) -> WorkflowSummary:
    """A workflow record as the list and summary answers show it (``WorkflowSummary``)."""
    return {
        "id": record.id,
        "name": record.name,
        "status": record.status,
        "pool": record.pool,
        "submitted_by": record.submitted_by,
        "labels": record.labels,
        "submit_time": iso(record.submit_time_s),
        "end_time": iso(record.end_time_s),
    }


def row_summary_json(row: dict[str, Any]) -> WorkflowSummary:
    """A ``Store.page_workflows`` row in ``summary_json``'s shape."""
    return {
        "id": row["id"],
        "name": row["name"],
        "status": row["status"],
        "pool": row["pool"],
        "submitted_by": row["submitted_by"],
        "labels": row["labels"] or {},
        "submit_time": iso(row["submit_time_s"]),
        "end_time": iso(row["end_time_s"]),
    }


def _attempt_json(a: m.TaskAttempt) -> AttemptAnswer:
    return {
        "retry_id": a.retry_id,
        "status": a.status.value,
        "exit_code": a.exit_code,
        "node": a.node,
        "start_time": iso(a.start_time_s),
        "end_time": iso(a.end_time_s),
        "failure_reason": a.failure_reason,
        "log_tail": list(a.log_tail),
    }


def task_json(t: m.TaskState, verbose: bool) -> TaskAnswer:
    """A task's current attempt (``TaskAnswer``); with ``verbose``, its earlier ones in
    ``retries``."""
    out: TaskAnswer = {
        "name": t.name,
        "status": t.status.value,
        "lead": t.lead,
        "retry_id": t.retry_id,
        "exit_code": t.exit_code,
        "node": t.node,
        "start_time": iso(t.start_time_s),
        "end_time": iso(t.end_time_s),
        "failure_reason": t.failure_reason,
        "log_tail": list(t.log_tail),
    }
    if verbose:
        out["retries"] = [_attempt_json(a) for a in t.history]
    return out


def workflow_json(record: WorkflowRecord, state: m.WorkflowState, verbose: bool) -> WorkflowAnswer:
    """The workflow with its groups and tasks, why it failed and why it waits
    (``WorkflowAnswer``, before ``query`` adds outputs, priority and tags)."""
    groups: list[GroupAnswer] = [
        {
            "name": g.name,
            "status": g.status.value,
            "tasks": [task_json(state.tasks[t], verbose) for t in g.tasks],
        }
        for g in state.groups.values()
    ]
    why = reasons_json(state)
    return {
        **summary_json(record),
        "status": state.status.value,
        "groups": groups,
        "failure": why["failure"],
        "waiting": why["waiting"],
    }


def reasons_json(state: m.WorkflowState) -> dict[str, Any]:
    """Why the workflow failed and why its groups wait, from the stored state
    (``engine.reasons``): ``{"failure": None | {"task", "group", "retry_id", "status",
    "exit_code", "reason", "log_tail": [lines], "end_time"}, "waiting": [{"group",
    "status", "reason", "since"}]}`` (times ISO 8601 UTC)."""
    failure = reasons.failure_of(state)
    if failure is not None:
        failure["end_time"] = iso(failure.pop("end_time_s"))
    waiting = [
        {**{k: v for k, v in w.items() if k != "since_s"}, "since": iso(w["since_s"])}
        for w in reasons.waits_of(state)
    ]  # ``since`` only, as documented
    return {"failure": failure, "waiting": waiting}


def _output_targets(record: WorkflowRecord) -> dict[str, list[str]]:
    """Task name -> where its ``outputs`` go (``url`` or ``dataset NAME``), as stored at
    submit (a record stored before ``outputs`` was: from its spec JSON)."""
    if "outputs" in record.source:
        return record.source["outputs"]
    spec = record.source.get("spec") or {}
    tasks = [t for g in spec.get("groups", []) for t in g.get("tasks", [])]
    targets: dict[str, list[str]] = {}
    for task in tasks:
        for out in task.get("outputs") or []:
            target = out.get("url") or f"dataset {(out.get('dataset') or {}).get('name')}"
            targets.setdefault(task["name"], []).append(target)
    return targets


def add_outputs(data: WorkflowAnswer, record: WorkflowRecord, run_dir: Any) -> None:
    """Give every task its ``output_dir`` (the ``{{output}}`` folder of its current attempt)
    and ``outputs`` (where the spec uploads it after success, ``{{workflow_id}}`` resolved as
    the runner resolves it: the URL the files are at)."""
    targets = _output_targets(record)
    tokens = {"workflow_id": record.id}
    for group in data["groups"]:
        for task in group["tasks"]:
            task["output_dir"] = str(run_dir(task["name"], task["retry_id"]) / "output")
            task["outputs"] = [substitute_tokens(t, tokens) for t in targets.get(task["name"], [])]


def event_message(event: Any, attempt: m.TaskState | m.TaskAttempt) -> str | None:
    """A runner event's message; the exit of an attempt the engine had already ended with
    a reason (a task stopped because its lead finished) says that reason, as the store does,
    not the runner's "stopped by SIGTERM"."""
    ended_s = attempt.end_time_s
    if (
        event.kind == "EXITED"
        and attempt.failure_reason
        and ended_s is not None
        and event.time_s >= ended_s
    ):
        return attempt.failure_reason
    return event.message or None


def event_row(
    time_s: float, task: str, retry_id: int, event: str, exit_code: int | None, message: str | None
) -> EventAnswer:
    """One row of the ``events`` answer; ``time_s`` in Unix seconds."""
    return {
        "time": iso(time_s),
        "task": task,
        "retry_id": retry_id,
        "event": event,
        "exit_code": exit_code,
        "message": message,
    }


def spec_error_json(exc: SpecError) -> list[dict[str, Any]]:
    """SpecError as JSON rows (for the API's 422 answer)."""
    return [
        {"path": p.path, "message": p.message, "line": p.line, "file": p.file} for p in exc.problems
    ]


def spec_error_from_json(rows: list[dict[str, Any]]) -> SpecError:
    """The inverse of ``spec_error_json`` (the CLI rebuilds the error it prints)."""
    return SpecError([SpecProblem(**row) for row in rows])
