"""Turns a ``StartTasks`` action into the backend's ``TaskLaunch`` list: one runner input
(``TaskRun``) per task attempt, with everything the runner needs and nothing it must ask for.

Folders (under ``$TRAINYARD_HOME/runs/<workflow>``):
    <task>/<retry>/            the attempt's run_dir (events.jsonl, task.log, sandbox state)
    <task>/<retry>/output/     its ``{{output}}``; downstream ``task:`` inputs read it
    _barrier/<group>/<gen>/    the barrier's rendezvous folder for one start of the whole gang
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard import dataroots
from trainyard.backends.base import Backend, TaskKey, TaskLaunch, TaskResources
from trainyard.backends.images import registry_credentials_for
from trainyard.engine.machine import StartTasks, WorkflowState
from trainyard.engine.scheduler import Placement
from trainyard.pools import Pool
from trainyard.runfile import RunCheckpoint, RunCredential, RunFile, RunInput, RunOutput, TaskRun
from trainyard.spec.models import TaskInput, TaskSpec, WorkflowSpec

__all__ = ["LaunchContext", "InputUnavailable", "build_launches"]


class InputUnavailable(Exception):
    """``LaunchContext.upstream_output`` cannot give a ``task:`` input a folder; the message
    says why. The input is handed to the runner with that reason, which fails it (2010)."""


@dataclass
class LaunchContext:
    """What building launches needs to know about the workflow and where it runs."""

    home: Path
    workflow_id: str
    spec: WorkflowSpec
    state: WorkflowState
    placements: dict[str, Placement]
    backend: Backend[Any]
    pool: Pool
    upstream_output: Callable[[str, str], Path]
    user: str | None = None
    """The submitter (datasets are read and written as them)."""
    data_credentials: list[dict[str, str]] | None = None
    """The submitter's DATA credentials' payloads (``CredentialVault.data_payloads``); a task
    gets those whose ``endpoint`` starts one of its URLs."""
    credentials: dict[str, tuple[str, dict[str, str]]] | None = None
    """The submitter's credentials the tasks name, ``{name: (type, payload)}``, decrypted
    (``CredentialVault.payloads``); None: none given (``--dry-run``'s preview: no value is
    ever rendered)."""
    registry_credentials: list[dict[str, str]] | None = None
    """The submitter's REGISTRY credentials' payloads (``CredentialVault.registry_payloads``):
    a task gets those for its image's registry, on its ``TaskLaunch`` (not in its run file)."""

    def run_dir(self, task: str, retry_id: int) -> Path:
        return self.home / "runs" / self.workflow_id / task / str(retry_id)


def _input(ctx: LaunchContext, item: TaskInput) -> dict[str, Any]:
    if item.task is not None:
        try:
            path = ctx.upstream_output(item.task, ctx.workflow_id)
        except InputUnavailable as exc:
            return {
                "kind": "task",
                "name": item.task,
                "source": "",
                "regex": item.regex,
                "unavailable": str(exc),
            }
        return {"kind": "task", "name": item.task, "source": str(path), "regex": item.regex}
    if item.url is not None:
        return {"kind": "url", "name": item.url, "source": item.url, "regex": item.regex}
    dataset = item.dataset
    assert dataset is not None  # the spec layer guarantees one kind per input
    return {
        "kind": "dataset",
        "name": dataset.name,
        "source": dataset.name,
        "path": dataset.path,
        "regex": item.regex or dataset.regex,
    }


def _hosts(ctx: LaunchContext, group_tasks: list[str]) -> dict[str, str]:
    hosts = {}
    for name in group_tasks:
        placement = ctx.placements.get(name)
        node = placement.node if placement else (ctx.state.tasks[name].node or "")
        key = TaskKey(ctx.workflow_id, name, ctx.state.tasks[name].retry_id)
        hosts[name] = ctx.backend.host_of(key, node)
    return hosts


def _barrier(ctx: LaunchContext, action: StartTasks, group_tasks: list[str]) -> dict[str, Any]:
    group = ctx.state.groups[action.group]
    whole_gang = {t for t, _r in action.tasks} == set(group_tasks)
    generation = max(r for _t, r in action.tasks)
    folder = ctx.home / "runs" / ctx.workflow_id / "_barrier" / action.group / str(generation)
    return {
        "enabled": group.barrier and whole_gang and len(group_tasks) > 1,
        "folder": str(folder),
        "tasks": group_tasks,
    }


def _task_run(ctx: LaunchContext, spec: TaskSpec, retry_id: int, shared: dict[str, Any]) -> TaskRun:
    run_dir = ctx.run_dir(spec.name, retry_id)
    group_tasks: list[str] = shared["group_tasks"]
    return TaskRun(
        workflow_id=ctx.workflow_id,
        group=shared["group"],
        task=spec.name,
        retry_id=retry_id,
        lead=spec.lead,
        lead_task=shared["lead"],
        image=spec.image,
        command=list(spec.command),
        args=list(spec.args),
        host_network=spec.host_network,
        privileged=spec.privileged,
        environment=dict(spec.environment),
        files=[RunFile(path=f.path, contents=f.contents or "") for f in spec.files],
        inputs=[RunInput.model_validate(_input(ctx, i)) for i in spec.inputs],
        outputs=[RunOutput.model_validate(o.model_dump(mode="json")) for o in spec.outputs],
        checkpoints=[
            RunCheckpoint.model_validate(c.model_dump(mode="json")) for c in spec.checkpoint
        ],
        volume_mounts=list(spec.volume_mounts),
        hosts=shared["hosts"],
        group_tasks=group_tasks,
        task_index=group_tasks.index(spec.name),
        barrier=shared["barrier"],
        run_dir=str(run_dir),
        output_dir=str(run_dir / "output"),
        data_roots=dataroots.data_roots(ctx.pool.options, ctx.home, ctx.user),
        data_home=str(ctx.home),
        user=ctx.user,
        credentials=[RunCredential.model_validate(c) for c in _credentials(ctx, spec)],
        data_credentials=_data_credentials(ctx, spec),
    )


def _credentials(ctx: LaunchContext, spec: TaskSpec) -> list[dict[str, Any]]:
    """The task's ``credentials:`` for the runner, each with its values (None: the
    submitter has no such credential, or this is a preview)."""
    found = ctx.credentials or {}
    runs = []
    for name, use in spec.credentials.items():
        values = found[name][1] if name in found else None
        if isinstance(use, str):
            runs.append({"name": name, "path": use, "values": values})
        else:
            runs.append({"name": name, "env": dict(use), "values": values})
    return runs


def _data_credentials(ctx: LaunchContext, spec: TaskSpec) -> list[dict[str, str]]:
    """The DATA credentials whose endpoint starts a URL the task reads or writes."""
    urls = [i.url for i in spec.inputs if i.url] + [o.url for o in spec.outputs if o.url]
    urls += [c.url for c in spec.checkpoint]
    return [
        p
        for p in ctx.data_credentials or []
        if any(u.startswith(p.get("endpoint", "\0")) for u in urls)
    ]


def _resources(ctx: LaunchContext, spec: TaskSpec) -> TaskResources:
    res = ctx.spec.resource_of(spec)
    return TaskResources(
        cpu=res.cpu or 0.0,
        gpu=res.gpu or 0,
        memory_bytes=res.memory_bytes or 0,
        storage_bytes=res.storage_bytes or 0,
    )


def build_launches(ctx: LaunchContext, action: StartTasks) -> list[TaskLaunch]:
    """One ``TaskLaunch`` per (task, retry id) of ``action``, in action order."""
    spec_group = next(g for g in ctx.spec.groups if g.name == action.group)
    group_tasks = [t.name for t in spec_group.tasks]
    shared = {
        "group": action.group,
        "group_tasks": group_tasks,
        "lead": spec_group.lead.name,
        "hosts": _hosts(ctx, group_tasks),
        "barrier": _barrier(ctx, action, group_tasks),
    }
    by_name = {t.name: t for t in spec_group.tasks}
    launches = []
    for name, retry_id in action.tasks:
        run = _task_run(ctx, by_name[name], retry_id, shared)
        placement = ctx.placements.get(name, Placement(ctx.state.tasks[name].node or ""))
        launches.append(
            TaskLaunch(
                key=TaskKey(ctx.workflow_id, name, retry_id),
                group=action.group,
                node=placement.node,
                run_dir=Path(run.run_dir),
                run=run.model_dump(mode="json"),
                gpu_slots=list(placement.gpu_slots),
                restart_in_place=action.restart_in_place,
                resources=_resources(ctx, by_name[name]),
                exec_timeout_s=ctx.state.exec_timeout_s,
                registry_credentials=registry_credentials_for(
                    by_name[name].image, ctx.registry_credentials or []
                ),
            )
        )
    return launches
