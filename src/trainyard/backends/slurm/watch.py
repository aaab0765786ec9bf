"""``JobWatch``: the facts of a Slurm backend's live attempts.

Each call tails every live attempt's ``<run_dir>/events.jsonl`` (the runner's); at most every
``status_interval_s`` squeue is asked about their jobs. A PENDING job's reason is kept in words
(``states.pending_reason``; for ``Resources`` with the running jobs it waits behind). An
attempt is over without an EXITED event when its job left the alive states, or its job runs
but its srun step is gone after the attempt started; after ``lost_grace_s`` (and one more read
of its events) it gets the fact of ``states.SLURM_STATES`` for the job's state.
"""

from __future__ import annotations

import logging
import time

from trainyard.backends.attempts import tail
from trainyard.backends.base import FactKind, TaskFact
from trainyard.backends.slurm.attempts import SlurmAttempt, SlurmAttempts, scrub_run_file
from trainyard.backends.slurm.cancelling import JobCanceller
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.backends.slurm.options import SlurmOptions
from trainyard.backends.slurm.script import RUNNER_OUT
from trainyard.backends.slurm.states import UNKNOWN, fact_for_state, is_alive, pending_reason
from trainyard.errors import BackendError
from trainyard.runner.report import EVENTS, read_events

__all__ = ["JobWatch"]

log = logging.getLogger("trainyard.backends.slurm")

_KNOWN_FACTS = {k.value for k in FactKind}
_ENDING = (FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR)

_States = dict[str, tuple[str, str]]
"""``{job id: (state, reason)}`` as squeue reports them (``SlurmCommands.job_states``)."""
_Steps = dict[str, dict[str, str]]
"""``{job id: {step name: JOB.STEP}}`` of running jobs (``SlurmCommands.steps``)."""


class JobWatch:
    """Reads the facts of the live attempts of ``attempts``.

    Args:
        attempts: the backend's attempts.
        commands: Slurm's commands (squeue).
        options: the pool's options (``status_interval_s``, ``lost_grace_s``).
        canceller: cancels a step whose stop waited for it to show.
    """

    def __init__(
        self,
        attempts: SlurmAttempts,
        commands: SlurmCommands,
        options: SlurmOptions,
        canceller: JobCanceller,
    ) -> None:
        self.attempts = attempts
        self.commands = commands
        self.options = options
        self.canceller = canceller
        self._last_status = float("-inf")  # monotonic time squeue was last asked

    def facts(self) -> list[TaskFact]:
        """Facts since the last call: runner events, each once, and the job-state fact of an
        attempt whose job or step ended without its EXITED event."""
        live = self.attempts.live()
        facts = [fact for attempt in live for fact in self.read_events(attempt)]
        if live and time.monotonic() - self._last_status >= self.options.status_interval_s:
            self._last_status = time.monotonic()
            facts += self._check_jobs([a for a in live if not a.done])
        return facts

    def read_events(self, attempt: SlurmAttempt) -> list[TaskFact]:
        """The facts of the attempt's runner events written since the last read (marks it
        reported once it has one, done once one ends it)."""
        if attempt.run_dir is None:
            return []
        events, attempt.offset = read_events(attempt.run_dir / EVENTS, attempt.offset)
        facts = [
            TaskFact(attempt.key, FactKind(e.kind), e.time_s, e.exit_code, e.message)
            for e in events
            if e.kind in _KNOWN_FACTS
        ]
        attempt.reported = attempt.reported or bool(facts)
        if any(f.kind in _ENDING for f in facts):
            attempt.done = True
        return facts

    def _check_jobs(self, live: list[SlurmAttempt]) -> list[TaskFact]:
        try:
            for attempt in live:
                self.attempts.resolve(attempt)
            jobs = {a.job_id for a in live if a.job_id}
            states = self.commands.job_states(jobs) if jobs else {}
            running = [j for j in jobs if states.get(j, ("",))[0] == "RUNNING"]
            steps = self.commands.steps(running) if running else {}
        except BackendError as exc:
            log.warning("slurm backend: cannot ask squeue: %s", exc)
            return []
        facts = []
        for attempt in live:
            facts += self._ending_fact(attempt, states, steps)
        return facts

    def _ending_fact(self, attempt: SlurmAttempt, states: _States, steps: _Steps) -> list[TaskFact]:
        """The attempt's ending fact, once its job or step is gone for ``lost_grace_s``."""
        if attempt.job_id is None:
            if time.time() < attempt.submit_by:  # a dead engine's sbatch may still answer
                return []
            return [self._gone(attempt, UNKNOWN, "no record of this attempt's Slurm job")]
        state, reason = states.get(attempt.job_id, (UNKNOWN, ""))
        attempt.waiting = (
            pending_reason(attempt.job_id, reason, self._behind(attempt.job_id, reason))
            if state == "PENDING"
            else ""
        )
        job_steps = steps.get(attempt.job_id, {})
        self.canceller.cancel_pending_step(attempt, job_steps)
        step_gone = state == "RUNNING" and attempt.reported and attempt.key.task not in job_steps
        if step_gone:
            return self._after_grace(
                attempt, "FAILED", f"Slurm job {attempt.job_id} runs but the task's step ended"
            )
        if is_alive(state):
            attempt.gone_since = None
            return []
        why = f"Slurm job {attempt.job_id} {state}{f' ({reason})' if reason else ''}"
        return self._after_grace(attempt, state, why)

    def _behind(self, job_id: str, reason: str) -> list[str]:
        """The running jobs a job pending for ``Resources`` waits behind, in words (none for
        another reason, or when squeue cannot say: the reason is shown without them)."""
        if reason.split(",")[0].strip() != "Resources":
            return []
        try:
            holders = self.commands.holders(job_id)
        except BackendError as exc:
            log.warning(
                "slurm backend: cannot ask squeue what job %s waits behind: %s", job_id, exc
            )
            return []
        return [f"Slurm job {h.job_id} '{h.name}' of {h.user} on {h.nodes}" for h in holders]

    def _after_grace(self, attempt: SlurmAttempt, state: str, why: str) -> list[TaskFact]:
        """``state`` (a key of ``SLURM_STATES``) decides the fact; ``why`` explains it."""
        now = time.monotonic()
        if attempt.gone_since is None:
            attempt.gone_since = now
        if now - attempt.gone_since < self.options.lost_grace_s:
            return []
        late = self.read_events(attempt)
        if attempt.done:
            return late
        return late + [
            self._gone(attempt, state, f"the task runner never reported its exit: {why}")
        ]

    def _gone(self, attempt: SlurmAttempt, state: str, message: str) -> TaskFact:
        """The attempt's ending fact for ``state``, with the tail of its srun output; its
        ``run.json`` loses its credential values."""
        attempt.done = True
        scrub_run_file(attempt)
        last = tail(attempt.run_dir / RUNNER_OUT) if attempt.run_dir else ""
        text = f"{message}: {last}" if last else message
        return TaskFact(attempt.key, fact_for_state(state), time.time(), None, text)
