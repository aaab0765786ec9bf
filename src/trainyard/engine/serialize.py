"""``WorkflowState`` to and from plain JSON-able dicts, for the store.

The round trip is exact: ``state_from_dict(state_to_dict(s)) == s``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainyard.engine.machine import GroupState, TaskAttempt, TaskState, WorkflowState
from trainyard.spec.models import ExitAction
from trainyard.status import Status, WorkflowStatus

__all__ = ["state_to_dict", "state_from_dict"]


def _task_to_dict(task: TaskState) -> dict[str, Any]:
    data = dataclasses.asdict(task)
    data["status"] = task.status.value
    data["exit_actions"] = {a.value: sorted(codes) for a, codes in task.exit_actions.items()}
    data["history"] = [{**dataclasses.asdict(h), "status": h.status.value} for h in task.history]
    return data


def _task_from_dict(data: dict[str, Any]) -> TaskState:
    fields = {f.name for f in dataclasses.fields(TaskState)}
    values = {k: v for k, v in data.items() if k in fields}
    values["status"] = Status(data["status"])
    values["gpu_slots"] = tuple(data.get("gpu_slots", ()))
    values["log_tail"] = tuple(data.get("log_tail", ()))
    values["exit_actions"] = {
        ExitAction(a): frozenset(codes) for a, codes in data.get("exit_actions", {}).items()
    }
    values["history"] = [
        TaskAttempt(
            **{**h, "status": Status(h["status"]), "log_tail": tuple(h.get("log_tail", ()))}
        )
        for h in data.get("history", [])
    ]
    return TaskState(**values)


def _group_to_dict(group: GroupState) -> dict[str, Any]:
    data = dataclasses.asdict(group)
    data["status"] = group.status.value
    data["upstream"] = sorted(group.upstream)
    return data


def _group_from_dict(data: dict[str, Any]) -> GroupState:
    fields = {f.name for f in dataclasses.fields(GroupState)}
    values = {k: v for k, v in data.items() if k in fields}
    values["status"] = Status(data["status"])
    values["upstream"] = frozenset(data.get("upstream", []))
    return GroupState(**values)


def state_to_dict(state: WorkflowState) -> dict[str, Any]:
    """A JSON-able dict of ``state``."""
    scalars = {
        f.name: getattr(state, f.name)
        for f in dataclasses.fields(WorkflowState)
        if f.name not in ("groups", "tasks")
    }
    scalars["status"] = state.status.value
    scalars["groups"] = [_group_to_dict(g) for g in state.groups.values()]
    scalars["tasks"] = [_task_to_dict(t) for t in state.tasks.values()]
    return scalars


def state_from_dict(data: dict[str, Any]) -> WorkflowState:
    """The ``WorkflowState`` that ``state_to_dict`` produced."""
    fields = {f.name for f in dataclasses.fields(WorkflowState)}
    values = {k: v for k, v in data.items() if k in fields and k not in ("groups", "tasks")}
    values["status"] = WorkflowStatus(data["status"])
    values["groups"] = {g["name"]: _group_from_dict(g) for g in data["groups"]}
    values["tasks"] = {t["name"]: _task_from_dict(t) for t in data["tasks"]}
    return WorkflowState(**values)
