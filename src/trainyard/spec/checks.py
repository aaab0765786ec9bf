"""Rules that relate several parts of a workflow: names, inputs, tokens, references, files.

Each check takes a validated ``WorkflowSpec`` and the spec's :class:`Layout` and returns
every :class:`Issue` it finds (never stops at the first).

Sources: OSMO docs, "Workflow specification" (names unique within the workflow; one lead per
group), "Inputs and outputs" (task inputs order the DAG), "Templates and special tokens"
(``{{input:N}}``, ``{{host:TASK}}``), "Resources" (``resource`` names a ``resources`` entry),
"Topology-Aware Scheduling" (one set of topology keys per workflow), "File injection".
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeGuard

from trainyard.spec.fields import name_key
from trainyard.spec.models import DEFAULT_RESOURCE, GroupSpec, TaskSpec, WorkflowSpec
from trainyard.spec.problems import Issue, Layout
from trainyard.spec.tokens import REFERENCE_TOKEN_PATTERN as _REFERENCE_TOKEN
from trainyard.spec.tokens import Token
from trainyard.spec.yamlsource import Loc

__all__ = ["Gaps", "NO_GAPS", "LocatedTask", "located_tasks", "check_workflow"]

_SAME_NAME = "names match case-insensitively and '-' equals '_'"


@dataclass(frozen=True)
class Gaps:
    """What a lenient view of a spec with field errors had to leave out
    (``trainyard.spec.partial``); the checks say nothing that depends on it.

    Attributes:
        inputs_of: paths (the spec's own form) of tasks whose ``inputs`` are not all known:
            their ``{{input:...}}`` tokens are not checked.
        resources: ``workflow.resources`` is not known: ``resource`` references are not
            checked.
        unnamed_in: indices of the groups that hold a task whose name is not known: an
            input that names no task is not reported if there is any, nor a ``{{host:X}}``
            that names no task of its group if that group is one (it may name that task).
    """

    inputs_of: frozenset[Loc] = frozenset()
    resources: bool = False
    unnamed_in: frozenset[int] = frozenset()


NO_GAPS = Gaps()
"""A well-formed spec: every part known."""


@dataclass(frozen=True)
class LocatedTask:
    """A task with its group, the group's index and its path in the spec."""

    group_index: int
    group: GroupSpec
    task: TaskSpec
    loc: Loc


def located_tasks(workflow: WorkflowSpec, layout: Layout) -> Iterator[LocatedTask]:
    """Every task of the workflow in spec order, with its path."""
    for gi, group in enumerate(workflow.groups):
        for ti, task in enumerate(group.tasks):
            yield LocatedTask(gi, group, task, layout.task_loc(gi, ti))


def check_workflow(workflow: WorkflowSpec, layout: Layout, gaps: Gaps = NO_GAPS) -> list[Issue]:
    """Every cross-part problem of ``workflow``, except those that depend on ``gaps``."""
    tasks = list(located_tasks(workflow, layout))
    return [
        *check_task_names(tasks),
        *check_group_names(workflow, layout),
        *check_inputs(workflow, tasks, gaps),
        *check_tokens(tasks, gaps),
        *([] if gaps.resources else check_resource_refs(workflow, tasks)),
        *check_topology_keys(workflow, tasks),
        *check_file_paths(tasks),
    ]


def _duplicates(named: list[tuple[Loc, str]], kind: str) -> list[Issue]:
    first: dict[str, str] = {}
    issues = []
    for loc, name in named:
        key = name_key(name)
        if key in first:
            issues.append(
                Issue(
                    loc,
                    f"{kind} name {name!r} is already used by {kind} "
                    f"{first[key]!r} ({_SAME_NAME}); rename one",
                )
            )
        first.setdefault(key, name)
    return issues


def check_task_names(tasks: list[LocatedTask]) -> list[Issue]:
    """Task names are unique in the workflow."""
    return _duplicates([(t.loc + ("name",), t.task.name) for t in tasks], "task")


def check_group_names(workflow: WorkflowSpec, layout: Layout) -> list[Issue]:
    """Group names are unique in the workflow (tasks form: groups are the tasks)."""
    if layout.tasks_form:
        return []
    named = [(layout.group_loc(i) + ("name",), g.name) for i, g in enumerate(workflow.groups)]
    return _duplicates(named, "group")


def _some(names: list[str], limit: int = 8) -> str:
    """``a, b, c`` or, for a long list, its first ``limit`` and how many more."""
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _upstream_graph(workflow: WorkflowSpec, group_of: dict[str, int]) -> dict[int, set[int]]:
    graph: dict[int, set[int]] = {i: set() for i in range(len(workflow.groups))}
    for gi, group in enumerate(workflow.groups):
        for task in group.tasks:
            for inp in task.inputs:
                target = group_of.get(name_key(inp.task)) if _local_ref(inp.task) else None
                if target is not None and target != gi:
                    graph[gi].add(target)
    return graph


def _reaches(graph: dict[int, set[int]], start: int, goal: int) -> list[int] | None:
    """A path start -> ... -> goal along upstream edges, if any."""
    stack, seen = [(start, [start])], {start}
    while stack:
        node, path = stack.pop()
        if node == goal:
            return path
        for nxt in graph[node] - seen:
            seen.add(nxt)
            stack.append((nxt, path + [nxt]))
    return None


@dataclass(frozen=True)
class _TaskGraph:
    group_of: dict[str, int]  # task name key -> group index
    upstream: dict[int, set[int]]  # group index -> groups it takes inputs from
    group_names: list[str]
    task_names: list[str]


def _local_ref(ref: str | None) -> TypeGuard[str]:
    """``ref`` names a task of this workflow (not ``WORKFLOW_ID:TASK``, which adds no edge and
    is resolved when the task runs; its shape is checked by the model)."""
    return ref is not None and ref != "" and ":" not in ref


def check_inputs(
    workflow: WorkflowSpec, tasks: list[LocatedTask], gaps: Gaps = NO_GAPS
) -> list[Issue]:
    """``task:`` inputs name an existing task of an earlier group; no cycles. An input of
    another workflow's task (``WORKFLOW_ID:TASK``) is not checked here: that workflow is not
    known to the spec layer; the engine resolves it when the task starts."""
    group_of = {name_key(t.task.name): t.group_index for t in tasks}
    graph = _TaskGraph(
        group_of,
        _upstream_graph(workflow, group_of),
        [g.name for g in workflow.groups],
        [t.task.name for t in tasks],
    )
    issues = []
    for located in tasks:
        for j, inp in enumerate(located.task.inputs):
            if inp.task is None or not _local_ref(inp.task):
                continue
            if gaps.unnamed_in and name_key(inp.task) not in group_of:
                continue  # it may name the task whose name is not known
            message = _input_problem(located.group_index, inp.task, graph)
            if message:
                issues.append(Issue(located.loc + ("inputs", j, "task"), message))
    return issues


def _input_problem(here: int, target_name: str, graph: _TaskGraph) -> str | None:
    target = graph.group_of.get(name_key(target_name))
    names = graph.group_names
    if target is None:
        return (
            f"input task {target_name!r} does not exist; name one of the tasks: "
            f"{_some(graph.task_names)}"
        )
    if target == here:
        return (
            f"input task {target_name!r} is in this task's own group {names[here]!r}, "
            "whose tasks start together; take inputs only from tasks of earlier groups"
        )
    if target < here:
        return None
    cycle = _reaches(graph.upstream, target, here)
    if cycle:
        loop = " -> ".join(names[i] for i in [here, *cycle])
        return (
            f"input task {target_name!r} makes a cycle of groups ({loop}); "
            "remove one of these inputs"
        )
    return (
        f"input task {target_name!r} is in group {names[target]!r}, defined after "
        f"{names[here]!r}; move that group before this one"
    )


def _token_fields(task: TaskSpec) -> Iterator[tuple[Loc, str]]:
    for i, part in enumerate(task.command):
        yield ("command", i), part
    for i, arg in enumerate(task.args):
        yield ("args", i), arg
    for key, value in task.environment.items():
        yield ("environment", key), value
    for i, spec in enumerate(task.files):
        if spec.localpath is None and spec.contents is not None:
            yield ("files", i, "contents"), spec.contents


def check_tokens(tasks: list[LocatedTask], gaps: Gaps = NO_GAPS) -> list[Issue]:
    """``{{host:X}}``, ``{{input:N}}`` and ``{{input:TASK}}`` refer to things that exist
    (input tokens of the tasks in ``gaps.inputs_of`` are not checked)."""
    members: dict[int, set[str]] = {}
    for located in tasks:
        members.setdefault(located.group_index, set()).add(name_key(located.task.name))
    groups_of = {name_key(t.task.name): t.group.name for t in tasks}
    issues = []
    for located in tasks:
        for field_loc, text in _token_fields(located.task):
            if "{{" not in text:
                continue
            for token in _checked_tokens(text):
                if _unknowable(token, located, gaps, members[located.group_index]):
                    continue
                message = _token_problem(token, located, members[located.group_index], groups_of)
                if message:
                    issues.append(
                        Issue(
                            located.loc + field_loc,
                            message,
                            token.start,
                            warning=token.kind == "host",
                        )
                    )
    return issues


def _unknowable(token: Token, located: LocatedTask, gaps: Gaps, members: set[str]) -> bool:
    """Whether what ``token`` refers to may be among the ``gaps``."""
    if token.kind == "input":
        return located.loc in gaps.inputs_of
    return located.group_index in gaps.unnamed_in and name_key(token.arg) not in members


def _checked_tokens(text: str) -> Iterator[Token]:
    """The first occurrence of each distinct ``host:`` or ``input:`` token of ``text``."""
    seen: set[str] = set()
    for match in _REFERENCE_TOKEN.finditer(text):
        if match.group(0) not in seen:
            seen.add(match.group(0))
            kind, _, arg = match.group(1).partition(":")
            yield Token(match.group(1), kind, arg, match.start(), match.group(0))


def _token_problem(
    token: Token, located: LocatedTask, members: set[str], groups_of: dict[str, str] | None = None
) -> str | None:
    if token.kind == "host" and name_key(token.arg) not in members:
        return _host_token_problem(token, located, groups_of or {})
    if token.kind == "input":
        return _input_token_problem(token, located.task)
    return None


def _host_token_problem(token: Token, located: LocatedTask, groups_of: dict[str, str]) -> str:
    """What to say of a ``{{host:X}}`` naming no task of its group (a warning: OSMO accepts
    it and the token stays as written, to fail at run time)."""
    names = _some([t.name for t in located.group.tasks])
    other = groups_of.get(name_key(token.arg))
    if other is not None:
        return (
            f"{token.text}: task {token.arg!r} is in group {other!r}, not in group "
            f"{located.group.name!r} (tasks: {names}); host tokens reach tasks of the "
            "same group only, so put both tasks in one group"
        )
    return (
        f"{token.text}: no task named {token.arg!r}; group {located.group.name!r} has "
        f"{names}; the token stays as written and fails at run time (OSMO accepts it)"
    )


def _input_token_problem(token: Token, task: TaskSpec) -> str | None:
    count = len(task.inputs)
    if token.arg.isdigit():
        if int(token.arg) < count:
            return None
        have = f"{count} inputs (0-{count - 1})" if count else "no inputs"
        return f"{token.text} refers to input {token.arg} but the task has {have}; fix the index"
    upstream = {name_key(i.task) for i in task.inputs if i.task}
    if name_key(token.arg) in upstream:
        return None
    return f"{token.text} names no task input of this task; add '- task: {token.arg}' to its inputs"


def check_resource_refs(workflow: WorkflowSpec, tasks: list[LocatedTask]) -> list[Issue]:
    """A task's ``resource`` names an entry of ``resources`` (``default`` may be absent)."""
    issues = []
    defined = ", ".join(workflow.resources) or "none"
    for located in tasks:
        name = located.task.resource
        if name in workflow.resources or name == DEFAULT_RESOURCE:
            continue
        issues.append(
            Issue(
                located.loc + ("resource",),
                f"resource {name!r} is not defined (defined: {defined}); "
                "add it under workflow.resources or name a defined one",
            )
        )
    return issues


def check_topology_keys(workflow: WorkflowSpec, tasks: list[LocatedTask]) -> list[Issue]:
    """Every task with topology requirements uses the same set of keys (OSMO docs,
    "Topology-Aware Scheduling": mixed key sets are rejected at submission). One issue per
    resource spec whose keys differ from those of the first task that has any."""
    first: tuple[str, frozenset[str]] | None = None
    issues = []
    for name in dict.fromkeys(t.task.resource for t in tasks):
        spec = workflow.resources.get(name)
        keys = frozenset(req.key for req in (spec.topology or [])) if spec else frozenset()
        if not keys:
            continue
        if first is None:
            first = (name, keys)
        elif keys != first[1]:
            issues.append(
                Issue(
                    ("workflow", "resources", name, "topology"),
                    f"topology keys {_keys(keys)} differ from {_keys(first[1])} of "
                    f"resource {first[0]!r}; every task with topology requirements "
                    "must use the same keys (give each the same key list, with its "
                    "own groups)",
                )
            )
    return issues


def _keys(keys: frozenset[str]) -> str:
    return "{" + ", ".join(sorted(keys)) + "}"


def check_file_paths(tasks: list[LocatedTask]) -> list[Issue]:
    """A task writes each file path once."""
    issues = []
    for located in tasks:
        first: dict[str, int] = {}
        for i, spec in enumerate(located.task.files):
            key = posixpath.normpath(spec.path)
            if key in first:
                issues.append(
                    Issue(
                        located.loc + ("files", i, "path"),
                        f"path {spec.path!r} is already written by files[{first[key]}] "
                        "of this task; keep one",
                    )
                )
            first.setdefault(key, i)
    return issues
