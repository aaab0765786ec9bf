"""Builders shared by the state machine tests: specs from the models, events folded in."""

from __future__ import annotations

from collections.abc import Iterable

from trainyard.engine.machine import Action, Event, Submitted, WorkflowState
from trainyard.engine.plan import build_state
from trainyard.engine.rules import transition
from trainyard.spec.models import (
    ExitAction,
    GroupSpec,
    TaskInput,
    TaskSpec,
    Timeout,
    WorkflowSpec,
)


def task(
    name: str,
    *,
    lead: bool = False,
    inputs: Iterable[str] = (),
    actions: dict[ExitAction, Iterable[int]] | None = None,
) -> TaskSpec:
    """A task running ``true``; ``inputs`` are task names, ``actions`` its exitActions."""
    return TaskSpec(
        name=name,
        command=["true"],
        lead=lead,
        inputs=[TaskInput(task=i) for i in inputs],
        exit_actions={a: frozenset(c) for a, c in (actions or {}).items()},
    )


def group(name: str, *tasks: TaskSpec, ignore_nonlead: bool = True) -> GroupSpec:
    return GroupSpec(name=name, tasks=list(tasks), ignore_nonlead_status=ignore_nonlead)


def workflow(
    *groups: GroupSpec, exec_s: float | None = None, queue_s: float | None = None
) -> WorkflowSpec:
    return WorkflowSpec(
        name="wf",
        groups=list(groups),
        timeout=Timeout(exec_timeout_s=exec_s, queue_timeout_s=queue_s),
    )


def solo(name: str, *, inputs: Iterable[str] = (), **kw: object) -> GroupSpec:
    """A group of one lead task, named like the task (OSMO's top-level ``tasks`` form)."""
    return group(name, task(name, lead=True, inputs=inputs, **kw))  # type: ignore[arg-type]


def fold(state: WorkflowState, *events: Event) -> tuple[WorkflowState, list[Action]]:
    """Apply ``events`` in order; all the actions, in order."""
    actions: list[Action] = []
    for event in events:
        state, more = transition(state, event)
        actions.extend(more)
    return state, actions


def submitted(spec: WorkflowSpec, *, max_retries: int = 3) -> WorkflowState:
    """``spec`` planned at t=0 and submitted at t=1."""
    state = build_state("wf-1", spec, max_retries=max_retries, now_s=0.0)
    return fold(state, Submitted(time_s=1.0))[0]
