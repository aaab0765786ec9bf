"""A placed gang as a Slurm batch request: the sbatch command, the batch script and its srun
steps, built apart from sending them (STYLE.md #3) so ``--dry-run`` prints exactly what would
be submitted and golden files pin it.

One job per gang, one node per task (a heterogeneous job where tasks differ, or with
``mixed_resources: max`` the largest request on each node); ``cpu`` -> ``--cpus-per-task``,
``memory`` -> ``--mem`` (MiB), ``gpu`` -> ``--gres=gpu:N``, exec timeout + ``time_margin_s`` ->
``--time`` (minutes), all rounded up; ``--no-requeue``. The script exports ``TRAINYARD_HOSTS``
(``{task: NodeAddr}``) and runs one ``srun`` step per task. Paths are shell-quoted, ``%``
doubled in file names, never on ``#SBATCH`` lines. Sources: sbatch(1), srun(1), slurm.conf(5).
The job's shape in full: docs/pools.md, "Slurm: the batch job".
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trainyard.backends.base import TaskKey, TaskLaunch, TaskResources
from trainyard.backends.slurm.options import SlurmOptions
from trainyard.runfile import SandboxSettings, TaskRun

__all__ = [
    "SlurmBatchRequest",
    "SrunStep",
    "build_request",
    "job_dir_of",
    "HOSTS_ENV",
    "RUNNER_OUT",
    "SCRIPT_NAME",
]

HOSTS_ENV = "TRAINYARD_HOSTS"
RUNNER_OUT = "runner.out"
SCRIPT_NAME = "job.sbatch"
MiB = 1024**2

_PREAMBLE = r"""
# Nodes Slurm gave each task (TY_NODE[i]) and their addresses (NodeAddr, slurm.conf(5)).
declare -a TY_NODE=()
declare -A TY_ADDR=()
ty_first_node() { scontrol show hostnames "$1" | head -n 1; }
ty_addresses() {
  local name addr
  while read -r name addr; do TY_ADDR[$name]=$addr; done < <(
    scontrol -o show node "$(IFS=,; echo "${TY_NODE[*]}")" |
      sed -n 's/^NodeName=\([^ ]*\) .*NodeAddr=\([^ ]*\) .*/\1 \2/p')
}
ty_hosts_json() {
  local out="{" sep="" i=0 name node
  for name in "$@"; do
    node=${TY_NODE[$i]}
    out+="$sep\"$name\": \"${TY_ADDR[$node]:-$node}\""
    sep=", "
    i=$((i + 1))
  done
  printf '%s}' "$out"
}
""".lstrip("\n")


@dataclass(frozen=True)
class SrunStep:
    """One task's ``srun`` line (without the trailing ``&``)."""

    key: TaskKey
    argv: list[str]

    @property
    def line(self) -> str:
        return shlex.join(self.argv) + " &"


@dataclass
class SlurmBatchRequest:
    """Everything one sbatch submission is, before it is sent.

    Attributes:
        job_name: ``--job-name``.
        job_dir: folder of the job (script, Slurm's output of the job).
        sbatch_argv: the sbatch command line, script path last.
        header: the ``#SBATCH`` option lines (heterogeneous components apart by ``hetjob``).
        steps: one srun step per task, in launch order.
        runs: each task's runner input, ``sandbox`` and ``hosts_env`` filled.
        launches: the launches this request was built from.
        heterogeneous: one job component per task (``#SBATCH hetjob``).
    """

    job_name: str
    job_dir: Path
    sbatch_argv: list[str]
    header: list[str]
    steps: list[SrunStep]
    runs: dict[TaskKey, TaskRun]
    launches: list[TaskLaunch] = field(default_factory=list)
    heterogeneous: bool = False

    @property
    def script_path(self) -> Path:
        return self.job_dir / SCRIPT_NAME

    @property
    def script(self) -> str:
        """The batch script's whole text."""
        lines = ["#!/bin/bash", *self.header, _describe(self), "set -u", _PREAMBLE.rstrip("\n")]
        lines += _node_lines(self) + [""] + [step.line for step in self.steps] + ["wait", ""]
        return "\n".join(lines)

    def render(self) -> str:
        """What ``--dry-run`` prints: the sbatch command, then the script."""
        return f"$ {shlex.join(self.sbatch_argv)}\n# ---- {self.script_path}\n{self.script}"


# --------------------------------------------------------------------------- resources


def _resource_flags(res: TaskResources, options: SlurmOptions) -> list[str]:
    """sbatch/srun flags for one task's resources (sbatch(1) --cpus-per-task, --mem, --gres),
    those the pool's ``requests`` names."""
    flags = []
    if res.cpu > 0 and "cpu" in options.requests:
        flags.append(f"--cpus-per-task={math.ceil(res.cpu - 1e-9)}")
    if res.memory_bytes > 0 and "memory" in options.requests:
        flags.append(f"--mem={math.ceil(res.memory_bytes / MiB)}M")
    if res.gpu > 0 and "gpu" in options.requests:
        flags.append(f"--gres=gpu:{res.gpu}")
    return flags


def _largest(launches: list[TaskLaunch]) -> TaskResources:
    res = [launch.resources for launch in launches]
    return TaskResources(
        cpu=max(r.cpu for r in res),
        gpu=max(r.gpu for r in res),
        memory_bytes=max(r.memory_bytes for r in res),
        storage_bytes=max(r.storage_bytes for r in res),
    )


def is_heterogeneous(launches: list[TaskLaunch], options: SlurmOptions) -> bool:
    """True when the job needs one component per task (tasks ask for different resources)."""
    differ = len({tuple(_resource_flags(launch.resources, options)) for launch in launches}) > 1
    return differ and options.mixed_resources == "hetjob"


def _time_flag(launches: list[TaskLaunch], options: SlurmOptions) -> list[str]:
    """``--time`` in minutes: exec timeout plus margin (None: the partition's default)."""
    limit_s = launches[0].exec_timeout_s
    if limit_s is None:
        return []
    return [f"--time={math.ceil((limit_s + options.time_margin_s) / 60)}"]


def _job_flags(launches: list[TaskLaunch], options: SlurmOptions, job_name: str) -> list[str]:
    flags = [f"--job-name={job_name}", "--no-requeue"]
    flags += [
        f"--{name}={value}"
        for name in ("partition", "account", "qos")
        if (value := getattr(options, name))
    ]
    return flags + _time_flag(launches, options)


def _header(launches: list[TaskLaunch], options: SlurmOptions, job_name: str) -> list[str]:
    """The ``#SBATCH`` lines: job flags, then one node per task."""
    lines = [f"#SBATCH {flag}" for flag in _job_flags(launches, options, job_name)]
    if is_heterogeneous(launches, options):
        for index, launch in enumerate(launches):
            if index:
                lines.append("#SBATCH hetjob")
            lines += [
                f"#SBATCH {f}"
                for f in ["--nodes=1", "--ntasks=1", *_resource_flags(launch.resources, options)]
            ]
        return lines
    flags = [
        f"--nodes={len(launches)}",
        "--ntasks-per-node=1",
        *_resource_flags(_largest(launches), options),
    ]
    return lines + [f"#SBATCH {flag}" for flag in flags]


# --------------------------------------------------------------------------- script parts


def _describe(request: SlurmBatchRequest) -> str:
    first = request.launches[0]
    tasks = ", ".join(launch.key.task for launch in request.launches)
    return (
        f"# trainyard: workflow {first.key.workflow_id}, group {first.group}: "
        f"one srun step per task ({tasks})"
    )


def _node_lines(request: SlurmBatchRequest) -> list[str]:
    """Fill TY_NODE and TY_ADDR, export the hosts JSON."""
    count = len(request.steps)
    if request.heterogeneous:
        lines = [
            f"for ty_g in $(seq 0 {count - 1}); do",
            '  ty_var="SLURM_JOB_NODELIST_HET_GROUP_$ty_g"',
            '  TY_NODE+=("$(ty_first_node "${!ty_var}")")',
            "done",
        ]
    else:
        lines = ['mapfile -t TY_NODE < <(scontrol show hostnames "$SLURM_JOB_NODELIST")']
    names = " ".join(shlex.quote(step.key.task) for step in request.steps)
    return lines + ["ty_addresses", f'export {HOSTS_ENV}="$(ty_hosts_json {names})"']


def _pattern_safe(path: Path) -> str:
    """A path for an sbatch/srun file name: ``%`` doubled (no filename patterns)."""
    return str(path).replace("%", "%%")


def _srun_argv(
    launch: TaskLaunch, index: int, hetjob: bool, options: SlurmOptions, python: str
) -> list[str]:
    place = (
        [f"--het-group={index}"] if hetjob else ["--nodes=1", "--ntasks=1", f"--relative={index}"]
    )
    run_dir = Path(launch.run_dir)
    argv = [
        "srun",
        *place,
        f"--job-name={launch.key.task}",
        "--kill-on-bad-exit=0",
        f"--output={_pattern_safe(run_dir / RUNNER_OUT)}",
        "--open-mode=append",
    ]
    argv += [
        f for f in _resource_flags(launch.resources, options) if f.startswith("--cpus-per-task")
    ]
    return (
        argv
        + list(options.srun_args)
        + [python, "-m", "trainyard.runner", str(run_dir / "run.json")]
    )


def job_dir_of(launches: list[TaskLaunch], home: Path) -> Path:
    """``<home>/runs/<workflow>/_slurm/<group>/<first task>.<retry>``: unique per start."""
    first = launches[0]
    return (
        home
        / "runs"
        / first.key.workflow_id
        / "_slurm"
        / first.group
        / f"{first.key.task}.{first.key.retry_id}"
    )


def _job_name(launches: list[TaskLaunch]) -> str:
    first = launches[0]
    return re.sub(r"[^A-Za-z0-9_.:-]", "_", f"trainyard:{first.key.workflow_id}:{first.group}")


def _sbatch_argv(job_dir: Path, options: SlurmOptions) -> list[str]:
    return [
        "sbatch",
        "--parsable",
        f"--chdir={job_dir}",
        f"--output={_pattern_safe(job_dir)}/slurm-%j.out",
        *options.sbatch_args,
        str(job_dir / SCRIPT_NAME),
    ]


# --------------------------------------------------------------------------- runner input


def _image_ref(image: str, options: SlurmOptions) -> str:
    if "://" in image or image.startswith(("/", "./")) or image.endswith(".sif"):
        return image
    return options.image_prefix + image


def _container_prefix(run: TaskRun, options: SlurmOptions, home: Path) -> list[str]:
    """``apptainer exec --cleanenv [args] --bind <home>/runs IMAGE`` (run folders at the same
    path): the container gets the task's variables from the runner's env file only
    (``SandboxSettings.env_flag``), never apptainer's own environment."""
    if options.container is None or not run.image:
        return []
    return [
        options.container,
        "exec",
        "--cleanenv",
        *options.container_args,
        "--bind",
        str(home / "runs"),
        _image_ref(run.image, options),
    ]


def _task_run(
    launch: TaskLaunch,
    options: SlurmOptions,
    home: Path,
    path_prepend: list[str],
    server_url: str | None,
) -> TaskRun:
    run = TaskRun.model_validate(launch.run)
    run.hosts_env = HOSTS_ENV
    prefix = _container_prefix(run, options, home)
    where = f"{options.container} image {run.image}" if prefix else "the node's own tools"
    run.sandbox = SandboxSettings(
        root=str(Path(launch.run_dir) / "sandbox" / "root"),
        path_prepend=[] if prefix else path_prepend,
        command_prefix=prefix,
        env_flag="--env-file" if prefix else None,
        env_file_shell=True,
        env={"TRAINYARD_SERVER_URL": server_url} if server_url else {},
        description=(
            f"slurm backend: one srun step of the group's job on a node Slurm picked; "
            f"/tmp and file paths rewritten to a private folder; {where}"
        ),
        summary="slurm srun step on a node Slurm picked, private /tmp folder, "
        + (f"{options.container} image {run.image}" if prefix else "the node's tools"),
    )
    return run


def build_request(
    launches: list[TaskLaunch],
    options: SlurmOptions,
    home: Path,
    python: str,
    path_prepend: dict[TaskKey, list[str]] | None = None,
    *,
    server_url: str | None = None,
) -> SlurmBatchRequest:
    """The batch request for one gang start (no side effects).

    Args:
        launches: the attempts to start together (a whole gang, or the retried part of one).
        options: the pool's options.
        home: ``$TRAINYARD_HOME`` (job folders under ``home/runs``).
        python: the interpreter that runs the runner on the nodes.
        path_prepend: per task, folders for the task's PATH (the image's local runtime).
        server_url: the trainyard server the tasks' own CLI talks to
            (``TRAINYARD_SERVER_URL`` in their environment; ``base.server_url_for_tasks``).

    Raises:
        ValueError: ``launches`` is empty.
    """
    if not launches:
        raise ValueError("a Slurm job needs at least one task")
    hetjob = is_heterogeneous(launches, options)
    job_dir = job_dir_of(launches, home)
    job_name = _job_name(launches)
    prepend = path_prepend or {}
    return SlurmBatchRequest(
        job_name=job_name,
        job_dir=job_dir,
        sbatch_argv=_sbatch_argv(job_dir, options),
        header=_header(launches, options, job_name),
        steps=[
            SrunStep(launch.key, _srun_argv(launch, i, hetjob, options, python))
            for i, launch in enumerate(launches)
        ],
        runs={
            launch.key: _task_run(launch, options, home, prepend.get(launch.key, []), server_url)
            for launch in launches
        },
        launches=list(launches),
        heterogeneous=hetjob,
    )
