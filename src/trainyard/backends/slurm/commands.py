"""The thin sending side: Slurm's commands run as subprocesses, their output parsed.

Every call translates subprocess failures into ``BackendError`` at this edge (STYLE.md #7).
The parsers are plain functions over the commands' text so that unit tests feed them
recorded output. Formats: sbatch(1) ``--parsable`` (``JOBID[;CLUSTER]``), squeue(1)
``--format`` (``%i`` job id, ``HETID+OFFSET`` for a heterogeneous job's components; ``%T``
state; ``%r`` reason; with ``--steps``: ``%i`` ``JOBID.STEPID``, ``%j`` step name), sacct(1)
``--parsable2 --noheader --allocations``; ``--name`` lookups use squeue's ``%Z`` (the job's
working directory, sbatch's ``--chdir``) to tell jobs of the same name apart.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from trainyard.errors import BackendError

__all__ = [
    "SlurmCommands",
    "parse_sbatch",
    "parse_squeue",
    "parse_steps",
    "parse_sacct",
    "parse_workdirs",
    "base_job_id",
    "expand_hostlist",
    "parse_holders",
    "Holder",
]


def base_job_id(job_id: str) -> str:
    """``1234+1`` (a heterogeneous component) or ``1234.0`` (a step) -> ``1234``."""
    return job_id.split("+", 1)[0].split(".", 1)[0].split("_", 1)[0]


def parse_sbatch(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` output. Raises BackendError if there is none."""
    first = stdout.strip().split(";", 1)[0]
    if not first.isdigit():
        raise BackendError(f"sbatch printed no job id: {stdout.strip()!r}")
    return first


def parse_squeue(stdout: str) -> dict[str, tuple[str, str]]:
    """``%i|%T|%r`` lines -> {base job id: (state, reason)}. For a heterogeneous job the
    first component that is not RUNNING speaks for the job."""
    jobs: dict[str, tuple[str, str]] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        job, state, reason = base_job_id(parts[0]), parts[1], (parts[2] if len(parts) > 2 else "")
        if job not in jobs or jobs[job][0] == "RUNNING":
            jobs[job] = (state, reason)
    return jobs


def parse_steps(stdout: str) -> dict[str, dict[str, str]]:
    """``%i|%j`` step lines -> {base job id: {step name: step id}} (``batch``/``extern`` kept)."""
    steps: dict[str, dict[str, str]] = {}
    for line in stdout.splitlines():
        step_id, _, name = line.strip().partition("|")
        if step_id and "." in step_id:
            steps.setdefault(base_job_id(step_id), {})[name] = step_id
    return steps


def parse_sacct(stdout: str) -> dict[str, str]:
    """``JobID|State`` lines -> {base job id: state} (``CANCELLED by 0`` kept as written)."""
    states: dict[str, str] = {}
    for line in stdout.splitlines():
        job_id, _, state = line.strip().partition("|")
        if job_id and state:
            states.setdefault(base_job_id(job_id), state)
    return states


def parse_workdirs(stdout: str) -> dict[str, str]:
    """``%i|%Z`` lines -> {base job id: working directory} (a path may hold ``|``)."""
    dirs: dict[str, str] = {}
    for line in stdout.splitlines():
        job_id, sep, workdir = line.rstrip("\n").partition("|")
        if sep and job_id.strip():
            dirs.setdefault(base_job_id(job_id.strip()), workdir)
    return dirs


@dataclass(frozen=True)
class Holder:
    """A running Slurm job on nodes that a pending job may use: what it waits behind."""

    job_id: str
    name: str
    user: str
    nodes: str
    """Its node list as squeue prints it (``ty-node[1-2]``)."""


_RANGE = re.compile(r"^(?P<head>[^\[\]]*)\[(?P<body>[^\[\]]+)\](?P<tail>[^\[\]]*)$")


def expand_hostlist(hostlist: str) -> set[str]:
    """Slurm's compressed node list as names: ``ty-node[1-2,5],gpu3`` -> ``{ty-node1,
    ty-node2, ty-node5, gpu3}`` (ranges keep their zero padding: ``n[01-02]`` -> ``n01,
    n02``); a part in another shape is taken as a name. Source: hostlist syntax, slurm.conf(5)
    "NodeName"."""
    names: set[str] = set()
    for part in re.split(r",(?![^\[]*\])", hostlist.strip()):
        found = _RANGE.match(part)
        if not found:
            names.update([part] if part else [])
            continue
        for piece in found["body"].split(","):
            low, _, high = piece.partition("-")
            numbers = [low] if not high else _span(low, high)
            names.update(f"{found['head']}{n}{found['tail']}" for n in numbers)
    return names


def _span(low: str, high: str) -> list[str]:
    if not (low.isdigit() and high.isdigit()) or int(high) - int(low) > 100_000:
        return [f"{low}-{high}"]
    return [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]


def parse_holders(stdout: str, wanted: set[str] | None) -> list[Holder]:
    """``%i|%j|%u|%N`` lines of running jobs -> the jobs on any of the nodes ``wanted``
    (None: every job), in squeue's order."""
    holders = []
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        if wanted is None or expand_hostlist(parts[3]) & wanted:
            holders.append(Holder(base_job_id(parts[0]), parts[1], parts[2], parts[3]))
    return holders


class SlurmCommands:
    """Runs sbatch, squeue, sacct and scancel with this pool's ``SLURM_CONF``.

    Args:
        slurm_conf: ``SLURM_CONF`` for every command (None: the environment's).
        timeout_s: how long one command may take.
    """

    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 30.0) -> None:
        self.env = {**os.environ, **({"SLURM_CONF": slurm_conf} if slurm_conf else {})}
        self.timeout_s = timeout_s

    def _run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{argv[0]} failed: {exc}") from exc
        if check and done.returncode != 0:
            raise BackendError(
                f"{argv[0]} exited {done.returncode}: {(done.stderr or done.stdout).strip()}"
            )
        return done

    def submit(self, argv: list[str]) -> str:
        """Run an sbatch command line; returns the job id. Raises BackendError."""
        return parse_sbatch(self._run(argv).stdout)

    def _squeue(self, job_ids: Iterable[str], extra: list[str], fmt: str) -> str:
        ids = sorted(set(job_ids))
        if not ids:
            return ""
        done = self._run(
            ["squeue", "--noheader", *extra, f"--jobs={','.join(ids)}", f"--format={fmt}"],
            check=False,
        )
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise BackendError(f"squeue exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job_states(self, job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
        """{job id: (state, reason)} from squeue, then sacct for jobs squeue has forgotten;
        a job neither knows is absent. Raises BackendError when squeue fails."""
        ids = set(job_ids)
        states = parse_squeue(self._squeue(ids, ["--states=all"], "%i|%T|%r"))
        missing = ids - set(states)
        if missing:
            states.update({j: (s, "") for j, s in self.sacct_states(missing).items()})
        return states

    def sacct_states(self, job_ids: Iterable[str]) -> dict[str, str]:
        """{job id: state} from sacct; empty when accounting is off or sacct fails."""
        argv = [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--jobs={','.join(sorted(job_ids))}",
            "--format=JobID,State",
        ]
        try:
            done = self._run(argv, check=False)
        except BackendError:
            return {}
        return parse_sacct(done.stdout) if done.returncode == 0 else {}

    def holders(self, job_id: str) -> list[Holder]:
        """The running jobs that the pending job ``job_id`` waits behind: those of its
        partition on the nodes it asked for (squeue ``%n``), or on any node of the partition
        when it asked for none. Raises BackendError when squeue fails."""
        asked = self._squeue([job_id], [], "%P|%n").strip().splitlines()
        if not asked:
            return []
        partition, _, nodes = asked[0].partition("|")
        running = self._run(
            [
                "squeue",
                "--noheader",
                "--states=RUNNING",
                f"--partition={partition.strip()}",
                "--format=%i|%j|%u|%N",
            ]
        ).stdout
        wanted = expand_hostlist(nodes) if nodes.strip() and nodes.strip() != "(null)" else None
        return [h for h in parse_holders(running, wanted) if h.job_id != job_id]

    def jobs_named(self, name: str) -> dict[str, str]:
        """{job id: working directory} of the jobs squeue knows (any state) named ``name``.
        Raises BackendError when squeue fails."""
        done = self._run(
            ["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i|%Z"]
        )
        return parse_workdirs(done.stdout)

    def steps(self, job_ids: Iterable[str]) -> dict[str, dict[str, str]]:
        """{job id: {step name: step id}} of the running steps. Raises BackendError."""
        return parse_steps(self._squeue(job_ids, ["--steps"], "%i|%j"))

    def step_nodes(self, job_id: str) -> dict[str, str]:
        """{step name: its node list} of the steps of ``job_id`` that squeue shows now
        (``workflow exec`` runs beside a task's step on its node). Raises BackendError."""
        found: dict[str, str] = {}
        for line in self._squeue([job_id], ["--steps"], "%j|%N").splitlines():
            name, _, nodes = line.strip().partition("|")
            if name and nodes:
                found[name] = nodes
        return found

    def cancel(self, target: str) -> None:
        """``scancel TARGET`` (a job, or ``JOB.STEP``): SIGTERM now, SIGKILL after the
        cluster's KillWait (scancel(1)). A target that already ended is not an error."""
        done = self._run(["scancel", target], check=False)
        if (
            done.returncode != 0
            and "already completing or completed" not in done.stderr
            and "Invalid job id" not in done.stderr
        ):
            raise BackendError(f"scancel {target} exited {done.returncode}: {done.stderr.strip()}")
