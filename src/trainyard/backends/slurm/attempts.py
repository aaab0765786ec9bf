"""``SlurmAttempts``: the attempts one Slurm backend object knows, in memory and in their index
records (``backends.attempts.AttemptIndex``), and the job of each.

A record is written before ``sbatch`` (``announce``) and again once the job id is known, so a
new backend object (after an engine restart) finds every attempt again; one whose record has
no job id is looked up in squeue by name and job folder, else by Slurm's output file
(``resolve``). Lifecycle: docs/pools.md, "Module: `src/trainyard/backends/slurm/backend.py`".
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from trainyard.backends.attempts import AttemptIndex
from trainyard.backends.base import TaskKey
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.backends.slurm.script import RUNNER_OUT, SlurmBatchRequest
from trainyard.errors import BackendError
from trainyard.runfile import scrub_credentials
from trainyard.runner.report import EVENTS

__all__ = ["SUBMIT_MARGIN_S", "SlurmAttempt", "SlurmAttempts", "scrub_run_file"]

log = logging.getLogger("trainyard.backends.slurm")

SUBMIT_MARGIN_S = 30.0
"""Beyond sbatch's own time limit, how long after its record an attempt may still be submitted
(the batch files are written in between)."""


@dataclass
class SlurmAttempt:
    """One task attempt run as a step of a Slurm job, as this backend object follows it."""

    key: TaskKey
    run_dir: Path | None
    job_id: str | None = None
    job_name: str | None = None
    job_dir: Path | None = None
    submit_by: float = 0.0  # Unix time by which sbatch has surely answered
    offset: int = 0  # bytes of its events.jsonl read so far
    reported: bool = False
    done: bool = False
    gone_since: float | None = None  # monotonic time its job or step was first seen gone
    stop_pending: bool = False
    waiting: str = ""  # why its job is PENDING (``pending_reason``), "" once it is not


class SlurmAttempts:
    """The attempts of one backend object, by key, and their index records.

    Args:
        state_dir: the backend's state folder (``<home>/slurm``); records live under
            ``<state_dir>/attempts``.
        commands: Slurm's commands, for finding the job of a record without a job id.
    """

    def __init__(self, state_dir: Path, commands: SlurmCommands) -> None:
        self.index = AttemptIndex(state_dir)
        self.commands = commands
        self.known: dict[TaskKey, SlurmAttempt] = {}

    def live(self) -> list[SlurmAttempt]:
        """The known attempts that have not ended (reported their end, or been reported gone)."""
        return [a for a in self.known.values() if not a.done]

    def announce(self, request: SlurmBatchRequest, timeout_s: float) -> list[SlurmAttempt]:
        """Write each attempt's index record, without a job id, before anything is submitted
        (``never_started``: no record means never submitted); ``timeout_s`` is sbatch's time
        limit. Returns the attempts (not remembered yet). Raises OSError."""
        submit_by = time.time() + timeout_s + SUBMIT_MARGIN_S
        attempts = [
            SlurmAttempt(
                launch.key,
                Path(launch.run_dir),
                job_name=request.job_name,
                job_dir=request.job_dir,
                submit_by=submit_by,
            )
            for launch in request.launches
        ]
        for attempt in attempts:
            self.save(attempt)
        return attempts

    def remember(self, attempt: SlurmAttempt) -> SlurmAttempt:
        """Keep ``attempt`` in memory, and its record once it has a job id. Returns it."""
        self.known[attempt.key] = attempt
        if attempt.job_id:
            self.save(attempt)
        return attempt

    def save(self, attempt: SlurmAttempt) -> None:
        """Write the attempt's index record (nothing for one without a run folder).
        Raises OSError."""
        if attempt.run_dir is None:
            return
        self.index.write(
            attempt.key,
            {
                "run_dir": str(attempt.run_dir),
                "job_id": attempt.job_id,
                "job_name": attempt.job_name,
                "job_dir": str(attempt.job_dir) if attempt.job_dir else None,
                "submit_by": attempt.submit_by,
            },
        )

    def find(self, key: TaskKey) -> SlurmAttempt | None:
        """The attempt, from memory or from the index (started by an earlier object)."""
        if key in self.known:
            return self.known[key]
        attempt = self.load(key)
        if attempt is not None:
            self.known[key] = attempt
        return attempt

    def load(self, key: TaskKey) -> SlurmAttempt | None:
        """The attempt as its index record has it (None without one, or an unreadable one)."""
        record = self.index.read(key)
        if record is None:
            return None
        try:
            job_id, job_dir = record.get("job_id"), record.get("job_dir")
            return SlurmAttempt(
                key,
                Path(record["run_dir"]),
                str(job_id) if job_id else None,
                record.get("job_name"),
                Path(job_dir) if job_dir else None,
                float(record.get("submit_by") or 0.0),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def resolve(self, attempt: SlurmAttempt) -> bool:
        """Find the job of an attempt whose record has no job id (the engine died around
        sbatch): by name and job folder in squeue, else by Slurm's output file in its job
        folder. Records the id found; returns whether the attempt has a job id now.

        Raises:
            BackendError: squeue failed.
        """
        if attempt.job_id is not None:
            return True
        if attempt.job_name is None or attempt.job_dir is None:
            return False
        named = self.commands.jobs_named(attempt.job_name)
        ours = sorted((j for j, d in named.items() if Path(d) == attempt.job_dir), key=int)
        found = ours[-1] if ours else _job_of_output(attempt.job_dir)
        if found is None:
            return False
        log.info("slurm backend: %s is Slurm job %s (found after a restart)", attempt.key, found)
        attempt.job_id = found
        if attempt.key in self.known:
            self.remember(attempt)
        else:
            self.save(attempt)
        return True

    def never_started(self, key: TaskKey) -> bool:
        """Whether ``key`` was surely never submitted: no record; or a record with no job
        id, no job found for it (``resolve``), sbatch's time up and no runner trace. When
        Slurm cannot be asked, an attempt whose record has no job id counts as started."""
        if key in self.known:
            return False
        attempt = self.load(key)
        if attempt is None:
            return True
        try:
            if self.resolve(attempt):
                return False
        except BackendError as exc:
            log.warning("slurm backend: cannot tell whether %s was submitted: %s", key, exc)
            return False
        return time.time() > attempt.submit_by and not _ran(attempt.run_dir)

    def earlier_run_dirs(self, key: TaskKey, run_dir: Path) -> list[Path]:
        """Run folders of the task's earlier attempts, latest first (from their records,
        else beside ``run_dir``)."""
        found: list[Path] = []
        for retry in range(key.retry_id - 1, -1, -1):
            earlier = self.load(TaskKey(key.workflow_id, key.task, retry))
            found.append(
                earlier.run_dir if earlier and earlier.run_dir else run_dir.parent / str(retry)
            )
        return found


def scrub_run_file(attempt: SlurmAttempt) -> None:
    """Take the credential values out of the attempt's ``run.json`` (``runfile.
    scrub_credentials``): its runner takes them out when it reads the file, but a job
    cancelled or ended while pending never runs it, and the run folder (0600, on the
    cluster's shared storage) is kept. A runner reading it at that moment gets either
    version whole (the file is replaced); a stopped one then fails with OSMO's "Could not
    find the credential", which the stop's status hides."""
    if attempt.run_dir is not None and scrub_credentials(attempt.run_dir / "run.json"):
        log.info(
            "slurm backend: %s: credential values taken out of its run.json "
            "(its runner never read them)",
            attempt.key,
        )


def _ran(run_dir: Path | None) -> bool:
    """Whether a runner has left a trace in ``run_dir`` (its srun output or its events)."""
    return run_dir is not None and ((run_dir / RUNNER_OUT).exists() or (run_dir / EVENTS).exists())


def _job_of_output(job_dir: Path) -> str | None:
    """The job id in ``<job_dir>/slurm-<id>.out`` (written by Slurm once the job starts)."""
    ids = [p.name[len("slurm-") : -len(".out")] for p in job_dir.glob("slurm-*.out")]
    return max((j for j in ids if j.isdigit()), key=int, default=None)
