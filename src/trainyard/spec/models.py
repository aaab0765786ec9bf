"""Typed model of an OSMO workflow spec (version 2), field for field.

YAML keys are OSMO's (``exitActions``, ``volumeMounts``, ...); attributes are snake_case with
the key as alias; unknown keys are refused, naming the field. Normalised forms:
``WorkflowSpec.groups`` is always filled (top-level ``tasks``: one group per task, OSMO's
rule); ``TaskSpec.exit_actions`` maps an action to a set of exit codes; ``Timeout`` in seconds
(``exec_timeout_s``, ``queue_timeout_s``); ``ResourceSpec`` with ``cpu`` in cores (float),
``gpu`` a count, ``memory_bytes``/``storage_bytes``. Rules of one field or object live here;
cross-part rules in ``spec.checks`` and ``spec.poolfit``. A dumped model
(``model_dump(by_alias=True)``) validates again to an equal model.
Source: OSMO docs, "Workflow specification".
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from trainyard.errors import SpecProblem
from trainyard.quantity import parse_duration_s, parse_quantity
from trainyard.spec.fields import (
    check_credential,
    check_credential_name,
    check_env_name,
    check_file_path,
    check_label_key,
    check_label_value,
    check_labels,
    check_name,
    check_regex,
    check_task_ref,
    check_url,
    format_exit_codes,
    parse_exit_codes,
    split_mount,
)

__all__ = [
    "ExitAction",
    "TopologyRequirement",
    "TopologySpec",
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
    "tasks_to_groups",
    "DEFAULT_RESOURCE",
    "SPEC_VERSION",
]

DEFAULT_RESOURCE = "default"
SPEC_VERSION = 2


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", populate_by_name=True, frozen=False, coerce_numbers_to_str=True
    )


class ExitAction(StrEnum):
    """What happens to a task after its command exits with a given code.

    Source: OSMO docs, "Exit actions". ``RESTART`` (re-run in place, same sandbox) is
    trainyard's addition; OSMO has COMPLETE, FAIL and RESCHEDULE.
    """

    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    RESCHEDULE = "RESCHEDULE"
    RESTART = "RESTART"


def _cores(value: Any) -> float:
    return float(parse_quantity(value))


def _byte_count(value: Any) -> int:
    return math.ceil(parse_quantity(value))


def _gpu_count(value: Any) -> int:
    amount = parse_quantity(value)
    if amount != int(amount):
        raise ValueError(f"a GPU count must be a whole number, got {value!r}; ask for 1, 2, ...")
    return int(amount)


def _seconds(value: Any) -> float:
    seconds = parse_duration_s(value)
    if seconds <= 0:
        raise ValueError(f"a duration must be positive, got {value!r}; leave it out for no limit")
    return seconds


def _mount(value: str) -> str:
    split_mount(value)
    return value


def _not_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty; give a value")
    return value


def _none_as_empty(value: Any) -> Any:
    return {} if value is None else value


_Q = int | float | str
Name = Annotated[str, AfterValidator(check_name)]
Url = Annotated[str, AfterValidator(check_url)]
Regex = Annotated[str, AfterValidator(check_regex)]
Cores = Annotated[float, BeforeValidator(_cores, json_schema_input_type=_Q)]
ByteCount = Annotated[int, BeforeValidator(_byte_count, json_schema_input_type=_Q)]
GpuCount = Annotated[int, BeforeValidator(_gpu_count, json_schema_input_type=_Q)]
Seconds = Annotated[float, BeforeValidator(_seconds, json_schema_input_type=int | float | str)]
ExitCodes = Annotated[
    frozenset[int], BeforeValidator(parse_exit_codes, json_schema_input_type=int | str)
]
LabelKey = Annotated[str, AfterValidator(check_label_key)]
LabelValue = Annotated[str, BeforeValidator(check_label_value, json_schema_input_type=str)]
EnvName = Annotated[str, AfterValidator(check_env_name)]
FilePath = Annotated[str, AfterValidator(check_file_path)]
Mount = Annotated[str, AfterValidator(_mount)]
NonEmpty = Annotated[str, AfterValidator(_not_empty)]
TaskRef = Annotated[str, AfterValidator(check_task_ref)]
CredentialName = Annotated[str, AfterValidator(check_credential_name)]
CredentialUse = Annotated[
    str | dict[str, str],
    BeforeValidator(check_credential, json_schema_input_type=str | dict[str, str]),
]


class TopologyRequirement(StrEnum):
    """How hard a topology requirement is. Source: OSMO docs, "Topology-Aware Scheduling"."""

    REQUIRED = "required"
    PREFERRED = "preferred"


class TopologySpec(_Model):
    """One co-location requirement of a resource spec: tasks with the same ``key`` and
    ``group`` land on the same physical unit at that level (rack, zone, gpu-clique).

    Source: OSMO docs, "Resources" (Topology Requirements) and "Topology-Aware Scheduling".
    """

    key: NonEmpty
    group: NonEmpty = "default"
    requirement_type: TopologyRequirement = Field(
        default=TopologyRequirement.REQUIRED, alias="requirementType"
    )


def _check_topology(value: list[TopologySpec] | None) -> list[TopologySpec] | None:
    keys = [t.key for t in value or []]
    for key in dict.fromkeys(k for k in keys if keys.count(k) > 1):
        raise ValueError(
            f"topology key {key!r} is given {keys.count(key)} times; give each "
            "key once per resource spec (its group says which tasks share it)"
        )
    return value


def _check_credentials(value: dict[str, str | dict[str, str]]) -> dict[str, str | dict[str, str]]:
    owner: dict[str, str] = {}
    for name, use in value.items():
        for var in use if isinstance(use, dict) else {}:
            if var in owner:
                raise ValueError(
                    f"environment variable {var} is set by both credentials "
                    f"{owner[var]!r} and {name!r}; give it one source"
                )
            owner[var] = name
    return value


class ResourceSpec(_Model):
    """Per-task resource request; one named entry of ``workflow.resources``.

    ``cpu``, ``memory`` and ``storage`` take Kubernetes quantities (``500m``, ``4``, ``1Gi``)
    or plain numbers (cores, bytes); byte counts are rounded up. Source: OSMO docs, "Resources".
    """

    cpu: Cores | None = None
    gpu: GpuCount | None = None
    memory_bytes: ByteCount | None = Field(default=None, alias="memory")
    storage_bytes: ByteCount | None = Field(default=None, alias="storage")
    platform: str | None = None
    nodes_excluded: list[str] = Field(default_factory=list, alias="nodesExcluded")
    topology: Annotated[list[TopologySpec] | None, AfterValidator(_check_topology)] = None

    @field_validator("platform", mode="before")
    @classmethod
    def _blank_platform(cls, value: Any) -> Any:
        return None if value == "" else value


class Timeout(_Model):
    """Workflow timeouts in seconds. ``None`` means no limit (the pool's default applies).

    YAML takes ``30s``, ``5m``, ``8h``, ``2d`` or bare seconds. Source: OSMO docs, "Timeouts".
    """

    exec_timeout_s: Seconds | None = Field(default=None, alias="exec_timeout")
    queue_timeout_s: Seconds | None = Field(default=None, alias="queue_timeout")


class DatasetRef(_Model):
    """A named dataset, optionally pinned to a version or tag (``name:version``)."""

    name: NonEmpty
    path: str | None = None
    regex: Regex | None = None


class TaskInput(_Model):
    """One entry of ``inputs``: exactly one of ``task``, ``url`` or ``dataset``.

    ``task`` is ``TASK`` (a task of this workflow: an edge of the DAG) or ``WORKFLOW_ID:TASK``
    (the output of a task of another workflow: no edge; read only when that task COMPLETED).
    """

    task: TaskRef | None = None
    url: Url | None = None
    dataset: DatasetRef | None = None
    regex: Regex | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TaskInput:
        _exactly_one(self, ("task", "url", "dataset"))
        return self


class TaskOutput(_Model):
    """One entry of ``outputs``: exactly one of ``url`` or ``dataset``."""

    url: Url | None = None
    dataset: DatasetRef | None = None
    regex: Regex | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> TaskOutput:
        _exactly_one(self, ("url", "dataset"))
        return self


def _exactly_one(model: BaseModel, kinds: tuple[str, ...]) -> None:
    given = [k for k in kinds if getattr(model, k) is not None]
    if len(given) != 1:
        what = " and ".join(given) if given else "none"
        raise ValueError(f"give exactly one of {', '.join(kinds)} (got {what})")


class FileSpec(_Model):
    """A file written into the task's sandbox before its command runs.

    Exactly one of ``contents`` / ``localpath``; after loading, ``localpath`` files have been
    read into ``contents`` (``localpath`` is kept for display). ``path`` is absolute and not
    under ``/trainyard`` (reserved for the task runner). Source: OSMO docs, "File injection".
    """

    path: FilePath
    contents: str | None = None
    localpath: str | None = None

    @model_validator(mode="after")
    def _has_source(self) -> FileSpec:
        if self.contents is None and self.localpath is None:
            raise ValueError("give the file's contents or a localpath")
        return self


class CheckpointSpec(_Model):
    """Periodic upload of ``path`` to ``url`` every ``frequency_s`` seconds."""

    path: NonEmpty
    url: Url
    frequency_s: Seconds = Field(alias="frequency")
    regex: Regex | None = None


def _check_command(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("command is empty; give the program to run as a list, such as [sh, -c]")
    if not value[0].strip():
        raise ValueError("the program (first element of command) is empty; name a program")
    return value


def _check_exit_actions(
    value: dict[ExitAction, frozenset[int]],
) -> dict[ExitAction, frozenset[int]]:
    seen: dict[int, ExitAction] = {}
    for action, codes in value.items():
        for other in {seen[c] for c in codes if c in seen}:
            shared = format_exit_codes(c for c in codes if seen.get(c) == other)
            raise ValueError(
                f"exit codes {shared} are mapped by both {other} and {action}; "
                "give each code one action"
            )
        seen.update(dict.fromkeys(codes, action))
    return value


Command = Annotated[list[str], AfterValidator(_check_command)]
ExitActions = Annotated[dict[ExitAction, ExitCodes], AfterValidator(_check_exit_actions)]


class TaskSpec(_Model):
    """One task: a process that runs on one node of the pool."""

    name: Name
    image: str | None = None
    command: Command
    args: list[str] = Field(default_factory=list)
    lead: bool = False
    environment: dict[EnvName, str] = Field(default_factory=dict)
    credentials: Annotated[
        dict[CredentialName, CredentialUse], AfterValidator(_check_credentials)
    ] = Field(default_factory=dict)
    inputs: list[TaskInput] = Field(default_factory=list)
    outputs: list[TaskOutput] = Field(default_factory=list)
    files: list[FileSpec] = Field(default_factory=list)
    resource: str = DEFAULT_RESOURCE
    volume_mounts: list[Mount] = Field(default_factory=list, alias="volumeMounts")
    exit_actions: ExitActions = Field(default_factory=dict, alias="exitActions")
    checkpoint: list[CheckpointSpec] = Field(default_factory=list)
    privileged: bool = False
    host_network: bool = Field(default=False, alias="hostNetwork")

    @field_validator(
        "args",
        "environment",
        "credentials",
        "inputs",
        "outputs",
        "files",
        "volume_mounts",
        "exit_actions",
        "checkpoint",
        mode="before",
    )
    @classmethod
    def _null_is_empty(cls, value: Any, info: Any) -> Any:
        if value is None:
            return {} if info.field_name in ("environment", "credentials", "exit_actions") else []
        return value

    def action_for(self, exit_code: int) -> ExitAction:
        """The exit action for ``exit_code``: the spec's mapping, else OSMO's default
        (0 -> COMPLETE, anything else -> FAIL). Source: OSMO docs, "Exit actions"."""
        for action, codes in self.exit_actions.items():
            if exit_code in codes:
                return action
        return ExitAction.COMPLETE if exit_code == 0 else ExitAction.FAIL


class GroupSpec(_Model):
    """A gang: tasks scheduled and started together, exactly one of them the lead.

    A group of one task makes that task its lead. Source: OSMO docs, "Group".
    """

    name: Name
    barrier: bool = True
    ignore_nonlead_status: bool = Field(default=True, alias="ignoreNonleadStatus")
    tasks: list[TaskSpec]

    @model_validator(mode="after")
    def _one_lead(self) -> GroupSpec:
        if len(self.tasks) == 1:
            self.tasks[0].lead = True
        leads = [t.name for t in self.tasks if t.lead]
        if not self.tasks:
            raise ValueError(f"group {self.name!r} has no tasks; give it at least one task")
        if len(leads) != 1:
            found = f"{len(leads)} lead tasks ({', '.join(leads)})" if leads else "no lead task"
            raise ValueError(
                f"group {self.name!r} has {found}; mark exactly one task with lead: true"
            )
        return self

    @property
    def lead(self) -> TaskSpec:
        """The group's lead task (validation guarantees there is exactly one)."""
        return next(t for t in self.tasks if t.lead)


def tasks_to_groups(data: Any) -> Any:
    """Normalise ``tasks:`` into one group per task (OSMO: each task is its own group).

    Takes the raw ``workflow`` mapping; returns it with ``groups`` (anything else unchanged).

    Raises:
        ValueError: both ``tasks`` and ``groups`` are given.
    """
    if not isinstance(data, dict) or "tasks" not in data:
        return data
    if "groups" in data:
        raise ValueError("give tasks or groups, not both; move the tasks into groups")
    rest = {k: v for k, v in data.items() if k != "tasks"}
    tasks = data["tasks"]
    if not isinstance(tasks, list):
        return {**rest, "groups": tasks}
    return {**rest, "groups": [_own_group(t) for t in tasks]}


def _own_group(task: Any) -> Any:
    name = task.get("name") if isinstance(task, dict) else getattr(task, "name", None)
    return {"name": name if isinstance(name, str) else "task", "tasks": [task]}


class WorkflowSpec(_Model):
    """The ``workflow:`` section, normalised so that ``groups`` is always set.

    YAML may give ``tasks`` (each its own group) or ``groups``, never both. ``labels`` follow
    Kubernetes label syntax, at most 16, string values.
    """

    name: Name
    pool: str | None = None
    labels: Annotated[dict[LabelKey, LabelValue], BeforeValidator(check_labels)] = Field(
        default_factory=dict
    )
    timeout: Annotated[Timeout, BeforeValidator(_none_as_empty)] = Field(default_factory=Timeout)
    resources: Annotated[
        dict[str, Annotated[ResourceSpec, BeforeValidator(_none_as_empty)]],
        BeforeValidator(_none_as_empty),
    ] = Field(default_factory=dict)
    groups: list[GroupSpec] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any) -> Any:
        data = tasks_to_groups(data)
        if isinstance(data, dict) and not data.get("groups"):
            raise ValueError("the workflow has no tasks; add tasks: or groups:")
        return data

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


def _check_version(value: int) -> int:
    if value != SPEC_VERSION:
        raise ValueError(f"version {value} is not supported; use version: {SPEC_VERSION}")
    return value


class SpecDocument(_Model):
    """A whole rendered spec file: ``version``, ``workflow`` and ``default-values``."""

    version: Annotated[int, AfterValidator(_check_version)] = SPEC_VERSION
    workflow: WorkflowSpec
    default_values: Annotated[dict[str, Any], BeforeValidator(_none_as_empty)] = Field(
        default_factory=dict, alias="default-values"
    )
    _warnings: list[SpecProblem] = PrivateAttr(default_factory=list)

    @property
    def warnings(self) -> list[SpecProblem]:
        """What ``spec.parse`` accepted but warns about (e.g. a key given twice in one
        mapping: the last value is used, as in OSMO), in spec order; not part of the
        model's fields or its dump."""
        return self._warnings
