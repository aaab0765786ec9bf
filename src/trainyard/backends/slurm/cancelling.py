"""``JobCanceller``: stops a Slurm backend's attempts with scancel(1).

All live attempts of a job stop: ``scancel JOB``. Some of them: ``scancel JOB.STEP`` for each
one's step (found by name in ``squeue --steps``); a step not started yet is cancelled as soon
as it shows (``cancel_pending_step``, from the status check). scancel sends SIGTERM (the
runner stops its command and reports its exit), then SIGKILL after the cluster's KillWait.
"""

from __future__ import annotations

import logging

from trainyard.backends.slurm.attempts import SlurmAttempt, SlurmAttempts, scrub_run_file
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.errors import BackendError

__all__ = ["JobCanceller"]

log = logging.getLogger("trainyard.backends.slurm")


class JobCanceller:
    """Cancels attempts' jobs or steps; a failed scancel or squeue is logged, not raised.

    Args:
        commands: Slurm's commands.
        attempts: the backend's attempts (to tell a whole job from some of its steps).
    """

    def __init__(self, commands: SlurmCommands, attempts: SlurmAttempts) -> None:
        self.commands = commands
        self.attempts = attempts

    def cancel(self, wanted: list[SlurmAttempt]) -> None:
        """Cancel these live attempts: each one's ``run.json`` loses its credential values
        first (``scrub_run_file``), then its job or its step is cancelled. Returns after
        the scancel calls."""
        for attempt in wanted:
            scrub_run_file(attempt)
        for job_id in sorted({a.job_id for a in wanted if a.job_id}):
            of_job = [a for a in wanted if a.job_id == job_id]
            if self._whole_job(job_id, of_job):
                self._scancel(job_id)
            else:
                for attempt in of_job:
                    attempt.stop_pending = True
                self._cancel_steps(job_id)

    def cancel_pending_step(self, attempt: SlurmAttempt, job_steps: dict[str, str]) -> None:
        """Cancel the step of an attempt whose stop waits for its step to show, if
        ``job_steps`` (``{step name: JOB.STEP}`` of its job) has it now."""
        if attempt.stop_pending and attempt.key.task in job_steps:
            self._scancel(job_steps[attempt.key.task])
            attempt.stop_pending = False

    def _whole_job(self, job_id: str, stopping: list[SlurmAttempt]) -> bool:
        """Whether ``stopping`` holds every live attempt of ``job_id``."""
        live = {a.key for a in self.attempts.live() if a.job_id == job_id}
        return live <= {a.key for a in stopping}

    def _cancel_steps(self, job_id: str) -> None:
        try:
            steps = self.commands.steps([job_id]).get(job_id, {})
        except BackendError as exc:
            log.warning("slurm backend: cannot list the steps of job %s: %s", job_id, exc)
            return
        for attempt in list(self.attempts.known.values()):
            if attempt.job_id == job_id:
                self.cancel_pending_step(attempt, steps)

    def _scancel(self, target: str) -> None:
        """scancel ``target`` (``JOB`` or ``JOB.STEP``)."""
        try:
            self.commands.cancel(target)
        except BackendError as exc:
            log.warning("slurm backend: %s", exc)
