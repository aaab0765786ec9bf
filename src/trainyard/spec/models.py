"""Typed model of an OSMO workflow spec (version 2), field for field.

The YAML keys are OSMO's (``ignoreNonleadStatus``, ``exitActions``, ``volumeMounts``,
``nodesExcluded``); the Python attributes are snake_case with the YAML key as alias.
Every model forbids unknown keys, so a typo is an error that names the field.

Normalised forms (so that the engine never parses text again):

- ``WorkflowSpec.groups`` is always filled: a spec with top-level ``tasks`` gets one group
  per task, named after the task, whose lead is that task (OSMO: "each task is its own group").
- ``TaskSpec.exit_actions`` maps an action to the *set of exit codes* it covers.
- ``Timeout`` holds seconds (``exec_timeout_s``, ``queue_timeout_s``).
- ``ResourceSpec`` holds ``cpu`` in cores (float), ``gpu`` as a count, and
  ``memory_bytes`` / ``storage_bytes`` as integers.

Source: OSMO docs, "Workflow specification" (workflow, groups, tasks, resources, timeouts,
exit actions, inputs/outputs, files, checkpoint).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ExitAction",
    "ResourceSpec",
    "Timeout",
    "TaskInput",
    "TaskOutput",
    "DatasetRef",
    "FileSpec",
    "CheckpointSpec",
    "TaskSpec",
    "GroupSpec",
    "WorkflowSpec",
    "SpecDocument",
    "DEFAULT_RESOURCE",
]

DEFAULT_RESOURCE = "default"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False)


class ExitAction(StrEnum):
    """What happens to a task after its command exits with a given code.

    Source: OSMO docs, "Exit actions". ``RESTART`` (re-run in place, same sandbox) is
    trainyard's addition; OSMO has COMPLETE, FAIL and RESCHEDULE.
    """

    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    RESCHEDULE = "RESCHEDULE"
    RESTART = "RESTART"


class ResourceSpec(_Model):
    """Per-task resource request; one named entry of ``workflow.resources``."""

    cpu: float | None = None
    gpu: int | None = None
    memory_bytes: int | None = Field(default=None, alias="memory")
    storage_bytes: int | None = Field(default=None, alias="storage")
    platform: str | None = None
    nodes_excluded: list[str] = Field(default_factory=list, alias="nodesExcluded")
    topology: list[dict[str, Any]] | None = None


class Timeout(_Model):
    """Workflow timeouts in seconds. ``None`` means no limit (the pool's default applies)."""

    exec_timeout_s: float | None = Field(default=None, alias="exec_timeout")
    queue_timeout_s: float | None = Field(default=None, alias="queue_timeout")


class DatasetRef(_Model):
    """A named dataset, optionally pinned to a version or tag (``name:version``)."""

    name: str
    path: str | None = None
    regex: str | None = None


class TaskInput(_Model):
    """One entry of ``inputs``: exactly one of ``task``, ``url`` or ``dataset``."""

    task: str | None = None
    url: str | None = None
    dataset: DatasetRef | None = None
    regex: str | None = None


class TaskOutput(_Model):
    """One entry of ``outputs``: exactly one of ``url`` or ``dataset``."""

    url: str | None = None
    dataset: DatasetRef | None = None
    regex: str | None = None


class FileSpec(_Model):
    """A file written into the task's sandbox before its command runs.

    Exactly one of ``contents`` / ``localpath``; after loading, ``localpath`` files have been
    read into ``contents`` (``localpath`` is kept for display).
    """

    path: str
    contents: str | None = None
    localpath: str | None = None


class CheckpointSpec(_Model):
    """Periodic upload of ``path`` to ``url`` every ``frequency_s`` seconds."""

    path: str
    url: str
    frequency_s: float = Field(alias="frequency")
    regex: str | None = None


class TaskSpec(_Model):
    """One task: a process that runs on one node of the pool."""

    name: str
    image: str | None = None
    command: list[str]
    args: list[str] = Field(default_factory=list)
    lead: bool = False
    environment: dict[str, str] = Field(default_factory=dict)
    credentials: dict[str, Any] = Field(default_factory=dict)
    inputs: list[TaskInput] = Field(default_factory=list)
    outputs: list[TaskOutput] = Field(default_factory=list)
    files: list[FileSpec] = Field(default_factory=list)
    resource: str = DEFAULT_RESOURCE
    volume_mounts: list[str] = Field(default_factory=list, alias="volumeMounts")
    exit_actions: dict[ExitAction, frozenset[int]] = Field(
        default_factory=dict, alias="exitActions"
    )
    checkpoint: list[CheckpointSpec] = Field(default_factory=list)
    privileged: bool = False
    host_network: bool = Field(default=False, alias="hostNetwork")

    def action_for(self, exit_code: int) -> ExitAction:
        """The exit action for ``exit_code``: the spec's mapping, else OSMO's default
        (0 -> COMPLETE, anything else -> FAIL). Source: OSMO docs, "Exit actions"."""
        for action, codes in self.exit_actions.items():
            if exit_code in codes:
                return action
        return ExitAction.COMPLETE if exit_code == 0 else ExitAction.FAIL


class GroupSpec(_Model):
    """A gang: tasks scheduled and started together, exactly one of them the lead."""

    name: str
    barrier: bool = True
    ignore_nonlead_status: bool = Field(default=True, alias="ignoreNonleadStatus")
    tasks: list[TaskSpec]

    @property
    def lead(self) -> TaskSpec:
        """The group's lead task (validation guarantees there is exactly one)."""
        return next(t for t in self.tasks if t.lead)


class WorkflowSpec(_Model):
    """The ``workflow:`` section, normalised so that ``groups`` is always set."""

    name: str
    pool: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    timeout: Timeout = Field(default_factory=Timeout)
    resources: dict[str, ResourceSpec] = Field(default_factory=dict)
    groups: list[GroupSpec] = Field(default_factory=list)

    def all_tasks(self) -> list[TaskSpec]:
        """Every task of every group, in spec order."""
        return [t for g in self.groups for t in g.tasks]

    def group_of(self, task_name: str) -> GroupSpec:
        """The group holding ``task_name``. Raises KeyError if there is none."""
        for group in self.groups:
            if any(t.name == task_name for t in group.tasks):
                return group
        raise KeyError(task_name)

    def resource_of(self, task: TaskSpec) -> ResourceSpec:
        """The resource spec a task asks for (an empty request if ``default`` is absent)."""
        return self.resources.get(task.resource, ResourceSpec())


class SpecDocument(_Model):
    """A whole rendered spec file: ``version``, ``workflow`` and ``default-values``."""

    version: int = 2
    workflow: WorkflowSpec
    default_values: dict[str, Any] = Field(default_factory=dict, alias="default-values")
