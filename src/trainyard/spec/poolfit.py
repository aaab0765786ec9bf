"""Rules that depend on the pool a workflow runs on: resource fit and host mounts.

A resource request must fit on one node of the pool (after ``nodesExcluded`` and on the
requested ``platform``), and a platform must be one some node declares. A volume mount's
host source must be allowed by the pool's ``options.allowed_mounts`` (a list of host paths;
a source equal to one of them or under it is allowed). The default is an empty list, so
every mount is refused until an administrator allows it. A task's ``hostNetwork: true`` needs
a pool with ``allow_host_network: true`` (a local pool otherwise gives each group a network
namespace of its own; the host's is an administrator's choice).

Sources: OSMO docs, "Resources" (platforms, nodesExcluded), "Host mounts" (the allowed host
directories are a pool setting).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from trainyard import dataroots
from trainyard.pools import NodeSpec, Pool, trainyard_home
from trainyard.quantity import format_bytes
from trainyard.spec.checks import LocatedTask, located_tasks
from trainyard.spec.fields import split_mount
from trainyard.spec.models import ResourceSpec, WorkflowSpec
from trainyard.spec.problems import Issue, Layout

__all__ = [
    "ALLOWED_MOUNTS_OPTION",
    "allowed_mounts",
    "check_pool",
    "check_mounts",
    "check_fit",
    "check_gang_size",
    "check_gang_total",
    "check_host_network",
    "check_data_urls",
]

ALLOWED_MOUNTS_OPTION = "allowed_mounts"
# (YAML key, attribute of both ResourceSpec and NodeSpec, how to print an amount)
_DIMENSIONS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("cpu", "cpu", lambda v: f"{v:.15g} cores"),
    ("gpu", "gpu", lambda v: f"{v} GPUs"),
    ("memory", "memory_bytes", lambda v: f"{format_bytes(int(v))} memory"),
    ("storage", "storage_bytes", lambda v: f"{format_bytes(int(v))} storage"),
)


def check_pool(
    workflow: WorkflowSpec, pool: Pool, layout: Layout | None = None, user: str | None = None
) -> list[Issue]:
    """Every pool-dependent problem of ``workflow`` on ``pool`` when ``user`` submits it
    (None: the home's owner, whose data roots are all of ``storage``)."""
    layout = layout or Layout()
    tasks = list(located_tasks(workflow, layout))
    fit = check_fit(workflow, pool)
    return [
        *check_mounts(tasks, pool),
        *check_data_urls(tasks, pool, user),
        *fit,
        *check_gang_size(workflow, pool, layout),
        *([] if fit else check_gang_total(workflow, pool, layout)),
        *check_host_network(tasks, pool),
    ]


def check_gang_total(workflow: WorkflowSpec, pool: Pool, layout: Layout) -> list[Issue]:
    """A group's tasks start together (a gang), so together they must fit the pool: per
    resource, what the group's tasks ask in total is at most what the nodes they may run on
    have in total (a gang that can never fit is refused, not queued forever)."""
    issues = []
    for index, group in enumerate(workflow.groups):
        specs = [workflow.resource_of(t) for t in group.tasks]
        nodes = _eligible_to_any(specs, pool)
        for key, attr, fmt in _DIMENSIONS:
            asked = sum(getattr(spec, attr) or 0 for spec in specs)
            total = sum(getattr(n, attr) for n in nodes)
            if asked > total + 1e-9:
                issues.append(
                    Issue(
                        layout.group_loc(index),
                        (
                            f"group {group.name!r} starts its {len(group.tasks)} tasks together and "
                            f"they ask for {fmt(asked)} in total ({key}), but pool {pool.name!r} has "
                            f"{fmt(total)} in total on the nodes they may use; ask for less per task, "
                            "use fewer tasks, or use a bigger pool"
                        ),
                    )
                )
    return issues


def _eligible_to_any(specs: list[ResourceSpec], pool: Pool) -> list[NodeSpec]:
    """The pool's nodes at least one of ``specs`` may run on, each once: one pass over the
    nodes per distinct (platform, ``nodesExcluded``) among ``specs`` (an N-node template's
    tasks share one), not one per task (1,000 tasks on 1,000 nodes: 0.35 s)."""
    kinds = {(spec.platform, frozenset(spec.nodes_excluded)): spec for spec in specs}
    found = {n.name: n for spec in kinds.values() for n in _eligible(spec, pool)}
    return list(found.values())


def _eligible(spec: ResourceSpec, pool: Pool) -> list[NodeSpec]:
    """The pool's nodes a task with ``spec`` may run on (platform, ``nodesExcluded``)."""
    return [
        n
        for n in pool.nodes
        if n.name not in spec.nodes_excluded and (not spec.platform or n.platform == spec.platform)
    ]


def check_host_network(tasks: list[LocatedTask], pool: Pool) -> list[Issue]:
    """A task with ``hostNetwork: true`` runs only on a local pool that allows it
    (``allow_host_network``); on a cluster pool tasks use their node's network anyway."""
    if pool.backend != "local" or pool.allow_host_network:
        return []
    return [
        Issue(
            located.loc + ("hostNetwork",),
            f"hostNetwork: true is not allowed on pool {pool.name!r}: its tasks get a "
            "network namespace of their group; remove hostNetwork, or an administrator "
            "can set allow_host_network: true for the pool in pools.yaml",
        )
        for located in tasks
        if located.task.host_network
    ]


def check_gang_size(workflow: WorkflowSpec, pool: Pool, layout: Layout) -> list[Issue]:
    """On a pool that gives each task of a group a node of its own (``Pool.node_per_task``:
    Slurm), a group has at most as many tasks as the pool has nodes."""
    if not pool.node_per_task:
        return []
    count = len(pool.nodes)
    return [
        Issue(
            layout.group_loc(index),
            f"group {group.name!r} has {len(group.tasks)} tasks but pool {pool.name!r} has "
            f"{count} node{'s' if count != 1 else ''}, and on a {pool.backend} pool each "
            "task of a group runs on a node of its own; use fewer tasks or a bigger pool",
        )
        for index, group in enumerate(workflow.groups)
        if len(group.tasks) > count
    ]


def allowed_mounts(pool: Pool) -> list[str]:
    """The host paths the pool allows as volume mount sources (normalised)."""
    value = pool.options.get(ALLOWED_MOUNTS_OPTION) or []
    paths = [value] if isinstance(value, str) else list(value)
    return [posixpath.normpath(str(p)) for p in paths]


def _is_allowed(source: str, allowed: list[str]) -> bool:
    return any(source == p or source.startswith(p.rstrip("/") + "/") for p in allowed)


def check_mounts(tasks: list[LocatedTask], pool: Pool) -> list[Issue]:
    """Each volume mount's host source is allowed by the pool."""
    allowed = allowed_mounts(pool)
    issues = []
    for located in tasks:
        for i, mount in enumerate(located.task.volume_mounts):
            source, _ = split_mount(mount)
            if not _is_allowed(source, allowed):
                issues.append(
                    Issue(located.loc + ("volumeMounts", i), _mount_message(source, pool, allowed))
                )
    return issues


def check_data_urls(tasks: list[LocatedTask], pool: Pool, user: str | None = None) -> list[Issue]:
    """Each ``file://`` URL (inputs, outputs, checkpoints) lies below one of ``user``'s data
    roots on the pool (``trainyard.dataroots``: ``options.allowed_data_roots``, else
    ``storage/<user>``; None: the home's owner). The runner checks again before it moves a
    byte (defence in depth: a symlink may change between submit and run).

    Returns:
        One issue per refused URL, at ``...inputs[i].url`` (or outputs, checkpoint), naming
        the task, the roots and what to do.
    """
    home = trainyard_home()
    roots = dataroots.data_roots(pool.options, home, user)
    issues = []
    for located in tasks:
        task = located.task
        fields = [("input", "inputs", i, item.url) for i, item in enumerate(task.inputs)]
        fields += [("output", "outputs", i, item.url) for i, item in enumerate(task.outputs)]
        fields += [
            ("checkpoint", "checkpoint", i, item.url) for i, item in enumerate(task.checkpoint)
        ]
        for what, key, index, url in fields:
            problem = dataroots.url_problem(url, roots, home, user) if url else None
            if problem:
                issues.append(
                    Issue(
                        located.loc + (key, index, "url"),
                        f"task {task.name!r} {what} {index}: {problem} (pool {pool.name!r})",
                    )
                )
    return issues


def _mount_message(source: str, pool: Pool, allowed: list[str]) -> str:
    return (
        f"volume mount source {source!r} is not allowed on pool {pool.name!r} "
        f"(allowed: {', '.join(allowed) or 'none'}); an administrator can allow it by "
        f"adding it to options.{ALLOWED_MOUNTS_OPTION} of the pool in pools.yaml"
    )


def check_fit(workflow: WorkflowSpec, pool: Pool) -> list[Issue]:
    """Each resource spec that a task uses fits on some node of the pool."""
    used = dict.fromkeys(t.resource for t in workflow.all_tasks())
    issues = []
    for name in used:
        if name in workflow.resources:
            issues += _fit_issues(("workflow", "resources", name), workflow.resources[name], pool)
    return issues


def _fit_issues(loc: tuple[str, ...], spec: ResourceSpec, pool: Pool) -> list[Issue]:
    nodes = [n for n in pool.nodes if n.name not in spec.nodes_excluded]
    if spec.platform:
        if spec.platform not in pool.platforms:
            return [Issue(loc + ("platform",), _platform_message(spec.platform, pool))]
        nodes = [n for n in nodes if n.platform == spec.platform]
    if not pool.nodes:
        return [Issue(loc, f"pool {pool.name!r} has no nodes; give it nodes or use another pool")]
    if not nodes:
        return [
            Issue(
                loc + ("nodesExcluded",),
                f"excludes every node of pool {pool.name!r}{_on(spec)}; exclude fewer nodes",
            )
        ]
    issues = [
        i
        for key, attr, fmt in _DIMENSIONS
        if (i := _dimension_issue(loc, spec, nodes, key, attr, fmt, pool))
    ]
    if not issues and not any(_holds(n, spec) for n in nodes):
        issues.append(
            Issue(
                loc,
                f"no single node of pool {pool.name!r}{_on(spec)} holds all of "
                "this request at once; ask for less of one resource",
            )
        )
    return issues


def _platform_message(platform: str, pool: Pool) -> str:
    if not pool.platforms:
        return (
            f"platform {platform!r} is not offered by pool {pool.name!r}, which declares no "
            "platforms; remove platform or use a pool that has it"
        )
    return (
        f"platform {platform!r} is not offered by pool {pool.name!r}; valid platforms: "
        f"{', '.join(sorted(pool.platforms))}"
    )


def _on(spec: ResourceSpec) -> str:
    return f" (platform {spec.platform})" if spec.platform else ""


def _dimension_issue(
    loc: tuple[str, ...],
    spec: ResourceSpec,
    nodes: list[NodeSpec],
    key: str,
    attr: str,
    fmt: Callable[[Any], str],
    pool: Pool,
) -> Issue | None:
    asked = getattr(spec, attr)
    largest = max(getattr(n, attr) for n in nodes)
    if asked is None or asked <= largest:
        return None
    return Issue(
        loc + (key,),
        f"asks for {fmt(asked)} but the largest node of pool "
        f"{pool.name!r}{_on(spec)} has {fmt(largest)}; ask for at most "
        f"{fmt(largest)} or use a pool with bigger nodes",
    )


def _holds(node: NodeSpec, spec: ResourceSpec) -> bool:
    return all((getattr(spec, attr) or 0) <= getattr(node, attr) for _, attr, _ in _DIMENSIONS)
