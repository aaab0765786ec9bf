"""The plan of a workflow: its DAG of groups and the initial ``WorkflowState``.

A group's upstream groups are the groups of the tasks named in its tasks' ``inputs[].task``
(OSMO docs, "Inputs": a task input makes the task wait for that task's outputs; tasks of a
group are scheduled together, so the edge is between their groups). An input of the form
``WORKFLOW_ID:TASK`` names a task of another, earlier workflow and adds no edge.
"""

from __future__ import annotations

from trainyard.engine.machine import GroupState, TaskState, WorkflowState
from trainyard.errors import SpecError, SpecProblem
from trainyard.pools import MAX_POOL_EXIT_CODE, Pool
from trainyard.spec.fields import parse_exit_codes
from trainyard.spec.models import ExitAction, GroupSpec, TaskSpec, WorkflowSpec

__all__ = ["group_upstreams", "topological_groups", "build_state", "default_exit_actions_of"]


def default_exit_actions_of(pool: Pool) -> dict[ExitAction, frozenset[int]]:
    """The pool's ``default_exit_actions`` as exit codes (OSMO's pool field; codes up to
    ``MAX_POOL_EXIT_CODE``, checked when the pool was loaded)."""
    return {
        ExitAction(action): parse_exit_codes(codes, MAX_POOL_EXIT_CODE)
        for action, codes in pool.default_exit_actions.items()
    }


def _input_path(g: int, t: int, i: int) -> str:
    return f"workflow.groups[{g}].tasks[{t}].inputs[{i}].task"


def _task_groups(spec: WorkflowSpec) -> dict[str, str]:
    """Task name -> the name of its group."""
    return {task.name: group.name for group in spec.groups for task in group.tasks}


def _upstream_of(spec: WorkflowSpec, g: int, owner: dict[str, str]) -> frozenset[str]:
    """The groups feeding group ``g`` (never itself). Raises SpecError on an unknown task."""
    group = spec.groups[g]
    found: set[str] = set()
    for t, task in enumerate(group.tasks):
        for i, item in enumerate(task.inputs):
            if item.task is None or ":" in item.task:
                continue  # a URL, a dataset, or another workflow's task: no edge
            if item.task not in owner:
                known = ", ".join(sorted(owner))
                message = f"unknown task {item.task!r}; the tasks are: {known}"
                raise SpecError([SpecProblem(_input_path(g, t, i), message)])
            found.add(owner[item.task])
    found.discard(group.name)
    return frozenset(found)


def group_upstreams(spec: WorkflowSpec) -> dict[str, frozenset[str]]:
    """Group name -> names of its upstream groups, in spec order.

    Raises:
        SpecError: an input names a task that is not in the workflow.
    """
    owner = _task_groups(spec)
    return {group.name: _upstream_of(spec, g, owner) for g, group in enumerate(spec.groups)}


def topological_groups(upstreams: dict[str, frozenset[str]]) -> list[str]:
    """Group names so that every group comes after its upstream groups.

    Stable: among groups that are ready at the same time, the order of ``upstreams`` (spec
    order) is kept. Raises SpecError naming the groups of a cycle.
    """
    order: list[str] = []
    done: set[str] = set()
    while len(order) < len(upstreams):
        ready = [g for g, ups in upstreams.items() if g not in done and ups <= done]
        if not ready:
            stuck = sorted(set(upstreams) - done)
            message = f"task inputs form a cycle among groups {stuck}"
            raise SpecError([SpecProblem("workflow.groups", message)])
        order.extend(ready)
        done.update(ready)
    return order


def _task_state(
    task: TaskSpec, group: GroupSpec, defaults: dict[ExitAction, frozenset[int]]
) -> TaskState:
    """The initial state of one task: PENDING, retry 0, its lead flag and its exit actions:
    the spec's, then ``defaults`` (the pool's) for the codes those do not cover."""
    actions = {action: frozenset(codes) for action, codes in task.exit_actions.items()}
    covered = frozenset().union(*actions.values())
    for action, codes in defaults.items():
        extra = frozenset(codes) - covered
        if extra:
            actions[action] = actions.get(action, frozenset()) | extra
            covered |= extra
    return TaskState(name=task.name, group=group.name, lead=task.lead, exit_actions=actions)


def _group_state(group: GroupSpec, upstream: frozenset[str]) -> GroupState:
    """The initial state of one group: PENDING, with its upstream groups and group flags."""
    return GroupState(
        name=group.name,
        tasks=[task.name for task in group.tasks],
        upstream=upstream,
        barrier=group.barrier,
        ignore_nonlead_status=group.ignore_nonlead_status,
    )


def build_state(
    workflow_id: str,
    spec: WorkflowSpec,
    *,
    max_retries: int,
    now_s: float,
    default_exit_actions: dict[ExitAction, frozenset[int]] | None = None,
) -> WorkflowState:
    """The initial state of a submitted workflow (everything PENDING, nothing started).

    Args:
        workflow_id: the workflow's id.
        spec: the validated spec (``groups`` filled, exactly one lead per group).
        max_retries: RESCHEDULE/RESTART attempts allowed per task (OSMO: set by the admin).
        now_s: submission time, Unix seconds (``submit_time_s``).
        default_exit_actions: the pool's (``default_exit_actions_of``), for the codes a
            task's own exit actions do not cover; kept in each task's state, so a restarted
            engine applies the rules the workflow was submitted with.

    Returns:
        Groups and tasks in spec order; timeouts from ``spec.timeout`` (seconds, None for
        no limit). Feed it ``Submitted`` to start it.

    Raises:
        SpecError: an input names an unknown task, or the inputs form a cycle.
    """
    upstreams = group_upstreams(spec)
    topological_groups(upstreams)
    return WorkflowState(
        id=workflow_id,
        groups={g.name: _group_state(g, upstreams[g.name]) for g in spec.groups},
        tasks={
            t.name: _task_state(t, g, default_exit_actions or {})
            for g in spec.groups
            for t in g.tasks
        },
        exec_timeout_s=spec.timeout.exec_timeout_s,
        queue_timeout_s=spec.timeout.queue_timeout_s,
        max_retries=max_retries,
        submit_time_s=now_s,
    )
