"""``SlurmBackend``: starts a gang as one Slurm job, reports facts, stops attempts.

The package's parts: ``script.py`` builds the job (``build_request``), ``jobfiles.py`` writes
its files, ``commands.py`` runs Slurm's commands, ``attempts.py`` keeps each attempt's index
record (written before ``sbatch``, so an engine restart finds every attempt again),
``watch.py`` turns runner events and squeue states into facts (and keeps a pending job's
reason for ``waiting_reason``), ``cancelling.py`` stops attempts with scancel.

Design: docs/pools.md, "Module: `src/trainyard/backends/slurm/backend.py`".
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainyard.backends.base import (
    Backend,
    TaskFact,
    TaskKey,
    TaskLaunch,
    server_url_for_tasks,
    task_api_env,
)
from trainyard.backends.images import runtime_for, runtime_path
from trainyard.backends.slurm.attempts import SlurmAttempt, SlurmAttempts
from trainyard.backends.slurm.cancelling import JobCanceller
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.backends.slurm.jobfiles import write_job_files
from trainyard.backends.slurm.options import SlurmOptions, parse_options
from trainyard.backends.slurm.script import SlurmBatchRequest, build_request
from trainyard.backends.slurm.states import UNKNOWN, is_alive
from trainyard.backends.slurm.watch import JobWatch
from trainyard.errors import BackendError, RefusedError
from trainyard.pools import Pool, trainyard_home

__all__ = ["SlurmBackend", "create"]

log = logging.getLogger("trainyard.backends.slurm")


class SlurmBackend(Backend[SlurmBatchRequest]):
    """Runs each gang as one Slurm job (see module docstring).

    Args:
        pool: the pool: its ``options`` (``SlurmOptions``), ``images`` and nodes.
        home: ``$TRAINYARD_HOME`` on the shared filesystem (default ``trainyard_home()``).
        commands: the Slurm command runner (tests pass a fake).
        python: the runner's interpreter on the nodes (default: the pool's ``python``
            option, else this interpreter).

    Raises:
        ConfigError: the pool's options are not valid.
    """

    name = "slurm"

    def __init__(
        self,
        pool: Pool,
        home: Path | None = None,
        *,
        commands: SlurmCommands | None = None,
        python: str | None = None,
    ) -> None:
        self.pool = pool
        self.options: SlurmOptions = parse_options(pool.name, dict(pool.options))
        self.home = Path(home) if home else trainyard_home()
        self.state_dir = self.home / "slurm"
        self.python = python or self.options.python or sys.executable
        self.commands = commands or SlurmCommands(self.options.slurm_conf)
        self.attempts = SlurmAttempts(self.state_dir, self.commands)
        self.index = self.attempts.index
        self.canceller = JobCanceller(self.commands, self.attempts)
        self.watch = JobWatch(self.attempts, self.commands, self.options, self.canceller)

    # ------------------------------------------------------------------ requests

    def build_request(self, launches: list[TaskLaunch]) -> SlurmBatchRequest:
        """The batch request for one gang start (no side effects; its ``render()`` is the
        sbatch command and script). The tasks' API tokens are added by ``send`` only.

        Raises:
            BackendError: the image runtime's folder cannot be made.
        """
        try:
            prepend = {launch.key: self._path_prepend(launch) for launch in launches}
        except OSError as exc:
            raise BackendError(
                f"slurm backend could not prepare group {launches[0].group!r}: {exc}"
            ) from exc
        return build_request(
            launches,
            self.options,
            self.home,
            self.python,
            prepend,
            server_url=server_url_for_tasks(self.home),
        )

    def _path_prepend(self, launch: TaskLaunch) -> list[str]:
        """Folders put first on the task's PATH for its image's runtime (none when the
        pool runs images in a container). Raises OSError."""
        if self.options.container is not None:
            return []
        return runtime_path(runtime_for(launch.run.get("image"), self.pool.images), self.state_dir)

    # ------------------------------------------------------------------ Backend API

    def send(self, request: SlurmBatchRequest) -> None:
        """Submit one job for the gang. Slurm starts all its tasks or none.

        Raises:
            BackendError: the files could not be written or sbatch refused the job.
        """
        launches = request.launches
        try:
            for run in request.runs.values():  # not in build_request: --dry-run prints it
                run.sandbox.env.update(task_api_env(self.home, run.workflow_id))
            attempts = self.attempts.announce(request, self.commands.timeout_s)
            write_job_files(request, self.attempts.earlier_run_dirs)
        except (OSError, subprocess.SubprocessError) as exc:
            raise BackendError(
                f"slurm backend could not write the job of group {launches[0].group!r}: {exc}"
            ) from exc
        job_id = self.commands.submit(request.sbatch_argv)
        log.info(
            "group %s of %s: Slurm job %s", launches[0].group, launches[0].key.workflow_id, job_id
        )
        for attempt in attempts:
            attempt.job_id = job_id
            self.attempts.remember(attempt)

    def poll(self) -> list[TaskFact]:
        """Facts since the last call: runner events, each once, and the job-state fact of an
        attempt whose job or step ended without its EXITED event."""
        return self.watch.facts()

    def stop(self, keys: list[TaskKey]) -> None:
        """Cancel these attempts (scancel: SIGTERM, SIGKILL after KillWait). Idempotent;
        returns after the scancel calls; a step not started yet is cancelled when it shows.
        Each one's ``run.json`` loses its credential values first (``JobCanceller``)."""
        wanted = [a for k in keys if (a := self.attempts.find(k)) is not None and not a.done]
        self.canceller.cancel(wanted)

    def waiting_reason(self, key: TaskKey) -> str:
        """Why the attempt's job waits in Slurm's queue (squeue ``%r`` of a PENDING job, in
        Slurm's word and plain words: ``states.pending_reason``), as of the last status
        check; "" when it does not wait (or is unknown here)."""
        attempt = self.attempts.find(key)
        return attempt.waiting if attempt is not None else ""

    def host_of(self, key: TaskKey, node: str) -> str:
        """A stand-in for ``{{host:TASK}}`` (the placed node's host name): Slurm picks the
        real node when the job starts, and the batch script hands the runner each task's
        node address through ``TaskRun.hosts_env``, which wins."""
        spec = next((n for n in self.pool.nodes if n.name == node), None)
        return (spec.hostname if spec and spec.hostname else node) or key.task

    def entry(self, key: TaskKey) -> dict[str, Any]:
        """How to run a command beside the running attempt ``key`` (``workflow exec``;
        ``Backend.entry``): ``{"backend": "slurm", "job_id", "node": the node of the task's
        step, "slurm_conf", "python": the runner's interpreter on the nodes}``, for ``srun
        --overlap --jobid JOB --nodelist NODE``.

        Raises:
            RefusedError: no job or no running step of the task is known.
        """
        attempt = self.attempts.find(key)
        if attempt is None or attempt.job_id is None:
            raise RefusedError(f"task {key.task} (retry {key.retry_id}) has no Slurm job")
        node = self.commands.step_nodes(attempt.job_id).get(key.task)
        if not node:
            raise RefusedError(f"task {key.task}: job {attempt.job_id} runs no step of it now")
        return {
            "backend": "slurm",
            "job_id": attempt.job_id,
            "node": node,
            "slurm_conf": self.commands.env.get("SLURM_CONF"),
            "python": self.python,
        }

    def close(self) -> None:
        """Nothing to release: Slurm holds the jobs."""

    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Adopt these attempts after an engine restart; returns those whose job is alive.

        Adopted attempts' events are reported again from the start (the engine treats
        repeats as no-ops); an attempt with no record here is reported LOST by ``poll``, and
        one whose record has no job id is looked up first (see ``unstarted``).
        """
        known = self.attempts
        attempts = [known.find(k) or known.remember(SlurmAttempt(k, None)) for k in keys]
        try:
            for attempt in attempts:
                known.resolve(attempt)
            jobs = {a.job_id for a in attempts if a.job_id}
            states = self.commands.job_states(jobs) if jobs else {}
        except BackendError as exc:
            log.warning("slurm backend: cannot ask squeue while recovering: %s", exc)
            return [a.key for a in attempts if a.job_id]
        return [
            a.key for a in attempts if a.job_id and is_alive(states.get(a.job_id, (UNKNOWN, ""))[0])
        ]

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Those of ``keys`` surely never submitted (``SlurmAttempts.never_started``), so
        starting them now cannot run one twice. When Slurm cannot be asked, an attempt whose
        record has no job id counts as started."""
        return [key for key in keys if self.attempts.never_started(key)]


def create(pool: Pool, home: Path) -> SlurmBackend:
    """Registry entry: the Slurm backend for ``pool`` with state under ``home``."""
    return SlurmBackend(pool, home)
