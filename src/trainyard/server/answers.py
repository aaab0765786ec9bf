"""The shapes of the REST answers that the CLI reads, shared by the server (which builds them,
``server.service``) and the CLI (which reads them). TypedDicts only: importing this module
costs the CLI nothing (no pydantic, no FastAPI). Times are ISO 8601 UTC strings or None.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

__all__ = [
    "WorkflowSummary",
    "WorkflowAnswer",
    "GroupAnswer",
    "TaskAnswer",
    "AttemptAnswer",
    "FailureAnswer",
    "WaitAnswer",
]


class WorkflowSummary(TypedDict):
    """One row of ``GET /api/workflow`` (``workflow list``); the head of every workflow answer."""

    id: str
    name: str
    status: str  #: a ``WorkflowStatus`` value
    pool: str
    submitted_by: str
    labels: dict[str, str]
    submit_time: str | None
    end_time: str | None


class AttemptAnswer(TypedDict):
    """One earlier attempt of a task (``retries``, with ``?verbose=true``)."""

    retry_id: int
    status: str  #: a ``Status`` value
    exit_code: int | None
    node: str | None
    start_time: str | None
    end_time: str | None
    failure_reason: str | None
    log_tail: list[str]


class TaskAnswer(AttemptAnswer):
    """A task's current attempt; ``output_dir`` and ``outputs`` where the server adds them."""

    name: str
    lead: bool
    retries: NotRequired[list[AttemptAnswer]]
    output_dir: NotRequired[str]  #: the attempt's ``{{output}}`` folder on the server's host
    outputs: NotRequired[list[str]]  #: where the task's outputs go (URLs, dataset names)
    isolation: NotRequired[list[str]]  #: how the attempt is isolated (``?isolation=true``)


class GroupAnswer(TypedDict):
    """A group of the workflow, its tasks in spec order."""

    name: str
    status: str
    tasks: list[TaskAnswer]


class FailureAnswer(TypedDict):
    """Why the workflow failed: the first task that failed it (``engine.reasons``)."""

    task: str
    group: str
    retry_id: int
    status: str
    exit_code: int | None
    reason: str | None
    log_tail: list[str]
    end_time: str | None


class WaitAnswer(TypedDict):
    """A group that waits to start, and why (``engine.reasons.waits_of``)."""

    group: str
    status: str
    reason: str
    since: str | None


class WorkflowAnswer(WorkflowSummary):
    """``GET /api/workflow/{id}`` (``workflow query``): the summary with the groups, the
    failure (None unless it failed), the waiting groups, its priority and tags."""

    groups: list[GroupAnswer]
    failure: FailureAnswer | None
    waiting: list[WaitAnswer]
    priority: NotRequired[str]
    tags: NotRequired[list[str]]


class EventAnswer(TypedDict):
    """One row of ``GET /api/workflow/{id}/events``: a task attempt's transition, oldest
    first (``event``: a runner event kind or the attempt's end ``Status``)."""

    time: str | None
    task: str
    retry_id: int
    event: str
    exit_code: int | None
    message: str | None


class TaskRowAnswer(TaskAnswer):
    """One row of ``GET /api/task`` (``task list``): a task with its workflow's fields."""

    workflow: str
    group: str
    pool: str
    user: str
    priority: str


class CancelAnswer(WorkflowSummary):
    """``POST /api/workflow/{id}/cancel``: the summary, whether it had already ended
    (nothing cancelled), and OSMO's ``--message`` kept with it."""

    had_ended: bool
    cancel_message: str | None


class DeleteAnswer(TypedDict):
    """``POST /api/workflow/delete``: the ids deleted."""

    deleted: list[str]


class KeptAnswer(TypedDict):
    """A workflow a prune left, and why."""

    id: str
    reason: str


class PruneAnswer(TypedDict):
    """``POST /api/workflow/prune``: ids deleted (with ``dry_run``: that would be), those
    left, and whether more are due (ask again)."""

    deleted: list[str]
    kept: list[KeptAnswer]
    more: bool
    dry_run: NotRequired[bool]


class TagAnswer(TypedDict):
    """One row of ``POST /api/tag``: a workflow's tags after the change."""

    id: str
    tags: list[str]


class PoolAnswer(TypedDict):
    """One row of ``GET /api/pool``."""

    name: str
    backend: str
    nodes: int  #: how many
    platforms: list[str]
    max_retries: int


class PoolReloadAnswer(TypedDict):
    """``POST /api/pool/reload``: the pools now served, those refused (name -> reason),
    those whose edit waits for their workflows, the file's error (or None), its path."""

    pools: list[str]
    refused: dict[str, str]
    kept: list[str]
    error: str | None
    file: str | None


class AmountsAnswer(TypedDict):
    """A node's resources: CPUs, GPUs, bytes of memory and of storage."""

    cpu: float
    gpu: int
    memory_bytes: int
    storage_bytes: int


class ResourceAnswer(TypedDict):
    """One row of ``GET /api/resource``: a node's capacity, used and free; ``virtual``: the
    capacity is declared, not measured."""

    pool: str
    node: str
    platform: str
    capacity: AmountsAnswer
    used: AmountsAnswer
    free: AmountsAnswer
    virtual: bool


class CredentialAnswer(TypedDict):
    """``POST /api/credentials/{name}`` and a row of ``GET /api/credentials`` (never a
    value; ``create_time`` in the list only)."""

    name: str
    type: str
    keys: list[str]
    create_time: NotRequired[str | None]


class DeletedAnswer(TypedDict):
    """``DELETE`` of a named thing (credential, user, app): its name, deleted."""

    name: str
    deleted: bool


class WhoamiAnswer(TypedDict):
    """``GET /api/whoami``: the token's user, whether an admin, and (a task token's) its
    workflow."""

    user: str
    admin: bool
    workflow: str | None


class VersionAnswer(TypedDict):
    """``GET /api/version``."""

    version: str


class ValidateAnswer(TypedDict):
    """``POST /api/workflow/validate``: the spec is valid (else an error answer), its
    workflow's name and pool, and its warnings."""

    valid: bool
    name: str
    pool: str
    warnings: list[dict[str, Any]]


class TokenAnswer(TypedDict):
    """One row of ``GET /api/token``: a token's owner, name, whether it is an admin's, its
    description and expiry date (YYYY-MM-DD; never the token itself)."""

    user: str
    name: str | None
    admin: bool
    description: str | None
    expires_at: str | None


class NewTokenAnswer(TypedDict):
    """``POST /api/token``: the token made, shown once."""

    user: str
    name: str
    token: str
    expires_at: str | None
    description: str | None


class TokenDeletedAnswer(TypedDict):
    """``DELETE /api/token/{name}``."""

    user: str
    name: str
    deleted: bool


class TokenRolesAnswer(TypedDict):
    """``GET /api/token/{name}/roles``: OSMO's role names of that token."""

    name: str
    roles: list[str]


class UserAnswer(TypedDict):
    """One row of ``GET /api/user``: a user and OSMO's role names."""

    id: str
    roles: list[str]


class NewUserAnswer(UserAnswer):
    """``POST /api/user``: the user made and their first token, shown once."""

    token: str


class UserInfoAnswer(UserAnswer):
    """``GET|PATCH /api/user/{id}``: the user with how many tokens they hold."""

    tokens: int


class UserDeletedAnswer(TypedDict):
    """``DELETE /api/user/{id}``: how many tokens went with the user."""

    id: str
    deleted_tokens: int


class AppAnswer(TypedDict):
    """An app version (``GET /api/app``, ``/api/app/{name}[/versions]``, ``POST
    /api/app/{name}``): ``spec`` with ``GET /api/app/{name}``, the spec's ``warnings``
    when a version is made."""

    name: str
    version: int
    owner: str
    description: str
    create_time: str | None
    spec: NotRequired[str]
    warnings: NotRequired[list[dict[str, Any]]]


class AppRenamedAnswer(TypedDict):
    """``POST /api/app/{name}/rename``: the new name and how many versions it covers."""

    name: str
    renamed_versions: int


class AppDeletedAnswer(TypedDict):
    """``DELETE /api/app/{name}``: the version deleted (None: every one) and how many."""

    name: str
    version: int | None
    deleted_versions: int


class TaskEntryAnswer(TypedDict):
    """``POST /api/workflow/{id}/task/{task}/entry``: how to enter a running attempt, with
    its backend's fields (``Backend.entry``): local ``machine`` (boot id), ``pid`` and
    ``created`` of its sandbox's init, ``address``, ``run_dir``; Slurm ``job_id``,
    ``node``, ``slurm_conf``; Kubernetes ``namespace``, ``pod``, ``container``,
    ``kubeconfig``, ``context``; Slurm and Kubernetes ``python`` (the runner's)."""

    workflow_id: str
    task: str
    retry_id: int
    status: str
    backend: str
    machine: NotRequired[str]
    pid: NotRequired[int]
    created: NotRequired[float]
    address: NotRequired[str]
    run_dir: NotRequired[str]
    job_id: NotRequired[str]
    node: NotRequired[str]
    slurm_conf: NotRequired[str | None]
    namespace: NotRequired[str]
    pod: NotRequired[str]
    container: NotRequired[str]
    kubeconfig: NotRequired[str | None]
    context: NotRequired[str | None]
    python: NotRequired[str]


class HealthAnswer(TypedDict):
    """``GET /api/health`` (no token): ``ok`` and the server's version."""

    status: str
    version: str


class LoginLinkAnswer(TypedDict):
    """``POST /api/login-link``: a one-time login path (relative to the server's address)
    and how long it is valid (seconds, as a string)."""

    path: str
    expires_in_s: str


class SubmitAnswer(TypedDict):
    """``POST /api/workflow`` (and ``/resubmit``, ``/api/app/NAME/submit``) without
    ``dry_run``: the new workflow's id, name and status, and the spec's warnings."""

    id: str
    name: str
    status: str  #: a ``WorkflowStatus`` value
    warnings: list[dict[str, Any]]  #: ``SpecProblem.to_json`` rows


class BackendShown(TypedDict):
    """What a pool's backend would be handed for one group (Slurm: its sbatch command and
    script), in a dry run."""

    group: str
    text: str


class DryRunAnswer(TypedDict):
    """The same routes with ``dry_run=true``: nothing stored; the rendered spec and what the
    backend would be handed (empty for backends without such a rendering)."""

    dry_run: bool  #: always true
    name: str
    pool: str
    spec: str  #: the rendered spec's text
    backend: list[BackendShown]
    warnings: list[dict[str, Any]]


class RunHeader(TypedDict):
    """One side of a diff: where the workflow ran."""

    id: str
    status: str
    pool: str
    backend: str


class DiffSetting(TypedDict):
    """A setting that differs: ``pool``, ``backend``, ``set.NAME``, ``label.KEY`` or
    ``image.TASK``; a value missing on one side is None."""

    field: str
    a: Any
    b: Any


class DiffMetric(TypedDict):
    """A final metric of one ``metrics.jsonl``, both sides (None where missing)."""

    file: str
    name: str
    a: Any
    b: Any
    same: bool


class DiffModel(TypedDict):
    """A model file paired by task and path; ``error`` alone when on one side only or not
    comparable (``compare.ModelComparison.to_json`` gives the rest)."""

    file: str
    identical: bool | None
    tensors: NotRequired[int]
    differing: NotRequired[list[str]]
    differing_count: NotRequired[int]
    only_in_a: NotRequired[list[str]]
    only_in_b: NotRequired[list[str]]
    same_bytes: NotRequired[bool | None]
    error: NotRequired[str]  #: empty when compared


class DiffAnswer(TypedDict):
    """``GET /api/workflow/A/diff/B`` (``workflow diff``): ``models_identical`` is None when
    there are no models or one could not be compared and none differs."""

    a: RunHeader
    b: RunHeader
    differences: list[DiffSetting]
    metrics: list[DiffMetric]
    models: list[DiffModel]
    models_identical: bool | None


class MetricsAnswer(TypedDict):
    """``GET /api/workflow/ID/metrics`` (``workflow metrics``): the metric curves
    (``dashboard.curves``), usage samples per attempt (``dashboard.usage``) and their
    summary (``dashboard.usage_summary``)."""

    id: str
    status: str
    curves: list[dict[str, Any]]
    usage: list[dict[str, Any]]
    summary: list[dict[str, Any]]
