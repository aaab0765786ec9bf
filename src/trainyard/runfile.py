"""The task runner's input: ``TaskRun``, the JSON a backend hands to ``python -m trainyard.runner``.

The engine builds one ``TaskRun`` per task attempt from the spec and the plan; the backend may
fill the ``sandbox`` part (``SandboxSettings``) and writes it to ``<run_dir>/run.json``.
Nothing here names a backend: the same JSON runs everywhere. Paths are absolute, as the runner
sees them (host paths bound at the same place under bubblewrap). ``hosts`` holds
``Backend.host_of`` of every task of the group; a backend that learns hosts only at run time
also sets ``hosts_env`` (``runtime_hosts``). Which fields the engine fills:
docs/architecture.md, "The runner's input".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FreshPath",
    "UserNamespace",
    "RunFile",
    "RunDataset",
    "RunInput",
    "RunOutput",
    "RunCheckpoint",
    "RunCredential",
    "scrub_credentials",
    "Barrier",
    "SandboxSettings",
    "OverlayMount",
    "TaskRun",
    "load_run",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RunFile(_Model):
    """A file the runner writes before the command runs (tokens resolved in ``contents``).

    ``path`` is absolute, or relative to the task's working directory ``/``.
    """

    path: str
    contents: str = ""


class RunDataset(_Model):
    """A named dataset (``name`` or ``name:version``), optionally a ``path`` inside it."""

    name: str
    path: str | None = None
    regex: str | None = None


class RunInput(_Model):
    """One entry of the task's ``inputs``.

    Attributes:
        kind: ``task`` (copy an upstream task's output folder), ``url`` (``file://`` built
            in; other schemes through fsspec or the data hook) or ``dataset`` (data hook).
        name: the upstream task (``{{input:TASK}}``), the URL, or the dataset name.
        source: what to fetch: the upstream output folder, the URL, the dataset name.
        path: for a dataset, the path inside it.
        regex: only files whose path relative to the source matches (``re.search``).
        dir: where the input lands (``{{input:N}}``); default ``<run_dir>/input/<N>``.
        unavailable: why the engine could not give this input a source (another workflow's
            task that did not complete, or is unknown): the input fails with exit code 2010
            (DOWNLOAD_FAILED) and this reason in the task log.
    """

    kind: Literal["task", "url", "dataset"]
    name: str
    source: str
    path: str | None = None
    regex: str | None = None
    dir: str | None = None
    unavailable: str | None = None


class RunOutput(_Model):
    """One entry of ``outputs``: the output folder is uploaded after success only."""

    url: str | None = None
    dataset: RunDataset | None = None
    regex: str | None = None

    @model_validator(mode="after")
    def _one_target(self) -> RunOutput:
        if (self.url is None) == (self.dataset is None):
            raise ValueError("an output needs exactly one of url, dataset")
        return self


class RunCheckpoint(_Model):
    """Upload ``path`` to ``url`` every ``frequency_s`` seconds (pause between the end of
    one upload and the start of the next) and once more when the command ends."""

    path: str
    url: str
    frequency_s: float = Field(gt=0)
    regex: str | None = None


class RunCredential(_Model):
    """One credential the task's spec names (``credentials:``), as OSMO hands it over.

    Attributes:
        name: the credential's name.
        env: mapping form: environment variable -> payload key.
        path: path form: the folder (inside the task) that gets one file per payload key.
        values: the payload (key -> secret), None when the submitter has no such credential
            (the task then fails: OSMO's "Could not find the credential: NAME"). Never in a
            repr; taken out of ``run.json`` when the runner reads it (``load_run``).
    """

    name: str
    env: dict[str, str] = Field(default_factory=dict)
    path: str | None = None
    values: dict[str, str] | None = Field(default=None, repr=False)


class Barrier(_Model):
    """Gang barrier before the command: every task of ``tasks`` marks itself ready in
    ``folder`` (the rendezvous folder, which every task of the group can see) and waits for
    all of them.

    The engine should give each start of the gang its own ``folder``: ready marks of
    an earlier gang attempt in the same folder would let the barrier pass early.
    """

    enabled: bool = False
    tasks: list[str] = Field(default_factory=list)
    folder: str | None = Field(
        default=None, validation_alias=AliasChoices("folder", "rendezvous_dir")
    )
    timeout_s: float = 600.0
    poll_interval_s: float = 0.1

    @model_validator(mode="after")
    def _dir_when_enabled(self) -> Barrier:
        if self.enabled and not self.folder:
            raise ValueError("an enabled barrier needs a rendezvous folder")
        return self


class OverlayMount(_Model):
    """A writable layer over a read-only host folder, private to the task (overlayfs).

    The runner mounts it, in a mount namespace of its own (its thread's), before anything
    else: ``lower`` (the host folder, never written) under ``upper`` (where the task's
    writes land) at ``target``; the sandbox prefix binds ``target`` into the task's view.
    ``work`` is overlayfs' scratch folder (same file system as ``upper``).

    With ``idmap_uid``/``idmap_gid`` the lower folder is first attached, idmapped, at
    ``<parent of work>/lower`` (host uid and gid 0 seen as these ids, ``safefs``), and that
    is the overlay's lower layer: the task whose uid 0 they are owns the host's root files
    there and may change them in place, in its upper layer only.

    ``lower_above`` are further read-only layers stacked over ``lower``, topmost first (a
    folder there gives the merged folder its owner and mode: ``sandbox.system_skeleton``;
    an opaque one hides what the layers below hold there: ``sandbox.fresh_layer``).

    ``lower_below``: further lower folders under ``lower``, top first (a container image's
    layers: ``lower`` is its top layer); with ``idmap_uid`` each is attached idmapped too,
    at ``<parent of work>/lower.N``, and the overlay is mounted with paths relative to that
    folder (overlayfs takes at most a page of options, and an image may have many layers).

    ``nodev``: mounted ``MS_NODEV``: device nodes in the layers cannot be opened (an image
    may carry any, such as a world-writable node of the host's disk).

    ``idmap_uid_base``/``idmap_gid_base`` (with ``idmap_uid``): the layers' ids 1..65535 are
    seen as ``BASE``..``BASE + 65534`` (a container's other users, ``backends.local.container``);
    only 0 and those are mapped then.
    """

    lower: str
    upper: str
    work: str
    target: str
    idmap_uid: int | None = None
    idmap_gid: int | None = None
    lower_above: list[str] = Field(default_factory=list)
    lower_below: list[str] = Field(default_factory=list)
    nodev: bool = False
    idmap_uid_base: int | None = None
    idmap_gid_base: int | None = None


class FreshPath(_Model):
    """A folder or file that the task gets empty (or holding ``text``) and as its own, in a
    private layer, instead of the host's (apt's download folders, its logs and its
    sandbox setting: ``sandbox.fresh_paths``). The runner makes it before the command
    starts, following no symlink below ``base``, unless its owner already is the task's
    host uid (an earlier attempt's, kept by RESTART, stays as the task left it).

    Attributes:
        base: a host folder the backend trusts (a private layer's merged view).
        relative: the path below ``base`` (``/``-separated, no ``..``); its parent folders
            must exist, else nothing is made (the host has no such tool).
        is_dir: a folder (made empty: what the host had there is hidden) or a file.
        mode: its permission bits.
        text: a file's contents.
    """

    base: str
    relative: str
    is_dir: bool
    mode: int = 0o755
    text: str = ""


class UserNamespace(_Model):
    """The task's user namespace, whose uid map the runner writes (bubblewrap's
    ``--userns-block-fd``): uid and gid 0 inside are ``host_uid``/``host_gid`` outside (an
    unprivileged id), and the host's uid 0 shows inside as ``host_root_as``, without any
    privilege over it (the command drops to uid 0 inside with no capability). So host files
    only root may read stay unreadable, as in a pod, whose root is not the host's.

    Attributes:
        host_uid: the host uid the task's uid 0 is.
        host_gid: the host gid its gid 0 is.
        host_root_as: the id inside that the host's root (the runner) has while bubblewrap
            sets the sandbox up.
        args_at: where in ``command_prefix`` the runner inserts ``--info-fd N
            --userns-block-fd M`` (before bubblewrap's ``--``); None when the prefix maps
            the ids itself (podman's ``--uidmap``, ``backends.local.container``): the runner then
            only gives the task its folders.
        own: host folders the runner gives to ``host_uid`` before the command starts (made
            if missing; a name ending ``/tmp`` gets mode 1777): the sandbox's root, its
            private folders, the tops of the private writable layers' views.
        own_dirs_below: host folders whose every folder below (not files) the runner gives
            to ``host_uid`` too (``/usr/local`` of a layer's view: ``pip install`` works).
            The output and input folders (everything in them) are given without being named.
        fresh: folders and files the task gets fresh and as its own (``FreshPath``).
        data_uid: the host uid the output and input folders are given to instead (the
            image's ``USER`` of a container that maps more than its root); None: ``host_uid``.
        data_gid: the same for the group.
    """

    host_uid: int
    host_gid: int
    host_root_as: int = 65534
    args_at: int | None = None
    own: list[str] = Field(default_factory=list)
    own_dirs_below: list[str] = Field(default_factory=list)
    fresh: list[FreshPath] = Field(default_factory=list)
    data_uid: int | None = None
    data_gid: int | None = None


class TaskLimits(BaseModel):
    """What the task may use, enforced by a control group of its own (``linux.cgroups``),
    as a pod's limits. 0 in a field: no limit for it.

    Attributes:
        memory_bytes: memory (and memory plus swap, where the kernel accounts swap).
        pids_max: processes and threads together.
        cpu: CPUs as a CFS quota (1.5: 150 ms of CPU time per 100 ms).
    """

    memory_bytes: int = 0
    pids_max: int = 0
    cpu: float = 0.0


class SandboxSettings(_Model):
    """What the backend filled in about the task's isolation.

    Attributes:
        root: set when the backend could NOT give the task its own ``/``: the task's private
            root folder. The runner then writes files under it (``/tmp/x`` -> ``root/tmp/x``),
            rewrites ``/tmp`` and those files' paths in command, args, environment and file
            contents, and runs the command with ``root`` as working directory.
        path_prepend: folders put on PATH right after the trainyard venv's bin folder (e.g. a
            folder of busybox applets for ``image: busybox``).
        env: variables the backend sets (``CUDA_VISIBLE_DEVICES``, ...); they win over the
            spec's.
        description: how the task is isolated, in full (one or more lines): kept in the
            task log as ``[task][detail]`` lines, shown by ``workflow logs --verbose`` and
            ``workflow query --verbose``.
        summary: the same in one short line (node, isolation, image), the task log's header
            (e.g. ``local-0, bubblewrap sandbox, host tools``); "": the description's first
            line is the header.
        command_prefix: argv put before the task's command, which then runs inside it
            (e.g. ``apptainer exec IMAGE`` for a pool that runs images with apptainer, or
            ``nsenter ... bwrap ... --`` for the local backend's sandbox).
        mounts: set when the command runs in a filesystem view of its own (``command_prefix``
            makes it) while the runner stays outside: ``{path inside: path here}``. The
            runner writes ``files`` and reads checkpoint folders at the host path of the
            longest matching entry (``/`` maps to the sandbox's root folder); text is never
            rewritten.
        readonly: the ``mounts`` entries the command sees read-only; the runner refuses to
            write a file there too.
        overlays: private writable layers the runner mounts before anything else (see
            ``OverlayMount``); a failure ends the attempt with START_ERROR (3003).
        volumes: the task's ``volumeMounts`` as ``{path inside: host path}``; a host path that
            does not exist ends the attempt with START_ERROR (3003) before anything runs.
        env_flag: the runtime's env file flag (``--env-file`` of ``podman run`` and of
            apptainer), set when the prefix is a container runtime: the runner writes the
            variables the task sets (its ``environment``, trainyard's task variables but
            ``PATH``, ``env``) to a 0600 file in the run folder and inserts ``ENV_FLAG FILE``
            before the prefix's last element (the image), so no value is on a command line
            and none reaches the runtime's own environment (``runner.hostenv``). The runtime
            also finds the command itself (no check beforehand).
        env_file_shell: the runtime reads that file as shell text (apptainer): values are
            quoted; podman reads them verbatim.
        limits: the task's limits, set by the runner in a control group of its own
            (``linux.cgroups``); None: none (a container runtime sets its own).
        env_defaults: variables written to that file first, which the task's own override
            (the image's ``ENV`` where podman runs a root of the runner's, ``--rootfs``).
        start_error: the backend found that the task cannot start (e.g. its image is not
            present): the runner logs this and reports exit code 3003 (START_ERROR) without
            waiting at the barrier or running anything.
        userns: set when the runner writes the task's uid map (``UserNamespace``).
    """

    root: str | None = None
    path_prepend: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    description: str = ""
    summary: str = ""
    command_prefix: list[str] = Field(default_factory=list)
    mounts: dict[str, str] = Field(default_factory=dict)
    readonly: list[str] = Field(default_factory=list)
    overlays: list[OverlayMount] = Field(default_factory=list)
    volumes: dict[str, str] = Field(default_factory=dict)
    env_flag: str | None = None
    env_file_shell: bool = False
    env_defaults: dict[str, str] = Field(default_factory=dict)
    limits: TaskLimits | None = None
    start_error: str | None = None
    missing_image: str | None = None
    """With ``start_error``: the image that could not be found or pulled (the attempt's
    exit then says ``failure: IMAGE_PULL``)."""
    userns: UserNamespace | None = None

    def _mount_of(self, path: str) -> str:
        best = ""
        for inside in self.mounts:
            prefix = inside.rstrip("/")
            if (path == inside or path.startswith(prefix + "/")) and len(inside) > len(best):
                best = inside
        return best

    def writable(self, path: str) -> bool:
        """Whether the command sees the absolute ``path`` writable (not under ``readonly``)."""
        return self._mount_of(path) not in self.readonly

    def host_path(self, path: str) -> str:
        """Where the absolute ``path`` of the command's view is for the runner (``mounts``)."""
        host, rest = self.host_split(path)
        return f"{host.rstrip('/')}/{rest}" if rest else host

    def host_split(self, path: str) -> tuple[str, str]:
        """``host_path`` as (the host folder of the longest matching ``mounts`` entry, the
        rest of ``path`` below it, relative); ``("/", path)`` without a match. The task may
        have made symlinks below the host folder, never above it (see ``linux.safefs``)."""
        best = self._mount_of(path)
        if not best:
            return "/", path.lstrip("/")
        return self.mounts[best], path[len(best.rstrip("/")) :].lstrip("/")


class TaskRun(_Model):
    """Everything the task runner needs to run one attempt of one task."""

    version: int = 1
    workflow_id: str
    group: str
    task: str
    retry_id: int = 0
    lead: bool = False
    lead_task: str | None = None
    image: str | None = None
    host_network: bool = False
    privileged: bool = False
    """The spec's ``privileged``: a backend that runs containers (Kubernetes) gives the task
    a privileged one where its pool allows it; the runner itself ignores it."""
    command: list[str] = Field(min_length=1)
    args: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)
    files: list[RunFile] = Field(default_factory=list)
    inputs: list[RunInput] = Field(default_factory=list)
    outputs: list[RunOutput] = Field(default_factory=list)
    checkpoints: list[RunCheckpoint] = Field(default_factory=list)
    volume_mounts: list[str] = Field(default_factory=list)
    hosts: dict[str, str] = Field(default_factory=dict)
    hosts_env: str | None = None
    group_tasks: list[str] = Field(default_factory=list)
    task_index: int = 0
    barrier: Barrier = Field(default_factory=Barrier)
    run_dir: str
    output_dir: str | None = None
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    stop_grace_s: float = 5.0
    data_roots: list[str] | None = None
    """Host folders ``file://`` URLs may use (``trainyard.dataroots``), with ``data_home``
    (``$TRAINYARD_HOME``); None: not checked here (the engine always sets them)."""
    data_home: str | None = None
    user: str | None = None
    """The workflow's submitter: datasets are read and written as them (None: unchecked)."""
    credentials: list[RunCredential] = Field(default_factory=list, repr=False)
    """The credentials the spec names, with their values (``RunCredential``)."""
    data_credentials: list[dict[str, str]] = Field(default_factory=list, repr=False)
    """The submitter's DATA credentials (OSMO's payload: ``access_key_id``, ``access_key``,
    ``endpoint``, ``region``, ``override_url``) whose endpoint starts a URL of the task:
    used for those URLs. Taken out of ``run.json`` as ``credentials`` are."""

    @model_validator(mode="after")
    def _defaults(self) -> TaskRun:
        if self.output_dir is None:
            self.output_dir = str(Path(self.run_dir) / "output")
        for index, item in enumerate(self.inputs):
            if item.dir is None:
                item.dir = str(Path(self.run_dir) / "input" / str(index))
        if not self.group_tasks:
            self.group_tasks = [self.task]
        return self

    def runtime_hosts(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``hosts`` with the entries of the ``hosts_env`` variable merged over them.

        A backend that learns the tasks' hosts only when the gang runs (Slurm picks the
        nodes) names in ``hosts_env`` a variable holding a JSON object ``{task: host}``.
        Without ``hosts_env``, or when the variable is absent or not such an object,
        ``hosts`` is returned unchanged.
        """
        raw = environ.get(self.hosts_env) if self.hosts_env else None
        try:
            found = json.loads(raw) if raw else {}
        except ValueError:
            return dict(self.hosts)
        if not isinstance(found, dict):
            return dict(self.hosts)
        return {**self.hosts, **{str(k): str(v) for k, v in found.items()}}

    @property
    def output_path(self) -> Path:
        """The ``{{output}}`` folder."""
        return Path(str(self.output_dir))

    def input_path(self, index: int) -> Path:
        """The ``{{input:index}}`` folder."""
        return Path(str(self.inputs[index].dir))

    @property
    def lead_name(self) -> str | None:
        """The group's lead task (``lead_task``; this task if it is the lead; else unknown)."""
        return self.lead_task or (self.task if self.lead else None)


def load_run(path: Path) -> TaskRun:
    """Read ``run.json``; when it holds credential values, write it back without them
    (the file replaced, 0600) so that they stay on disk only until the runner starts: the
    returned ``TaskRun`` has them. Raises ``pydantic.ValidationError`` or ``OSError``."""
    run = TaskRun.model_validate_json(Path(path).read_text())
    if run.data_credentials or any(c.values is not None for c in run.credentials):
        _forget_credentials(Path(path), run)
    return run


def scrub_credentials(path: Path) -> bool:
    """Take every credential value out of the ``run.json`` at ``path`` (names, variables and
    folders stay; the file replaced, 0600), for an attempt whose runner never read it (a
    Slurm job cancelled or ended while pending: ``load_run`` is what scrubs otherwise).
    Idempotent; never raises.

    Returns:
        True when values were found and taken out; False when there were none, or the file
        is missing or cannot be read as a run file (then nothing is written).
    """
    try:
        run = TaskRun.model_validate_json(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not (run.data_credentials or any(c.values is not None for c in run.credentials)):
        return False
    try:
        _forget_credentials(Path(path), run)
    except OSError:
        return False
    return True


def _forget_credentials(path: Path, run: TaskRun) -> None:
    """Rewrite ``path`` as ``run`` with every credential's values removed."""
    kept = run.model_copy(
        update={
            "data_credentials": [],
            "credentials": [c.model_copy(update={"values": None}) for c in run.credentials],
        }
    )
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(kept.model_dump_json())
    os.replace(partial, path)
