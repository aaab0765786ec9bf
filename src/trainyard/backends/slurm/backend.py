"""``SlurmBackend``: starts a gang as one Slurm job, reports facts, stops attempts.

Start: an index record per attempt (``<home>/slurm/attempts/<workflow>/<task>/<retry>.json``)
is written before ``sbatch``, so an engine restart finds every attempt again; the job id is
added once known. ``poll`` tails each attempt's ``events.jsonl`` and asks squeue (at most every
``status_interval_s``) about jobs that have not reported their exit; ``waiting_reason`` gives
squeue's pending reason in words (sbatch(1), squeue(1) "JOB REASON CODES").

Design: docs/pools.md, "Module: `src/trainyard/backends/slurm/backend.py`".
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.backends.attempts import AttemptIndex, tail, write_private
from trainyard.backends.base import (
    Backend,
    FactKind,
    TaskFact,
    TaskKey,
    TaskLaunch,
    server_url_for_tasks,
    task_api_env,
)
from trainyard.backends.images import runtime_for, runtime_path
from trainyard.backends.slurm.commands import SlurmCommands
from trainyard.backends.slurm.options import SlurmOptions, parse_options
from trainyard.backends.slurm.script import RUNNER_OUT, SlurmBatchRequest, build_request
from trainyard.backends.slurm.states import UNKNOWN, fact_for_state, is_alive, pending_reason
from trainyard.errors import BackendError, RefusedError
from trainyard.pools import Pool, trainyard_home
from trainyard.runfile import scrub_credentials
from trainyard.runner.report import EVENTS, read_events

__all__ = ["SlurmBackend", "create"]

log = logging.getLogger("trainyard.backends.slurm")

_KNOWN_FACTS = {k.value for k in FactKind}
_ENDING = (FactKind.EXITED, FactKind.LOST, FactKind.START_ERROR)
ADOPTED = ("sandbox", "output")
"""Folders of a run folder that a RESTART in place takes over from the attempt before."""
SUBMIT_MARGIN_S = 30.0
"""Beyond sbatch's own time limit, how long after its record an attempt may still be submitted
(the batch files are written in between)."""


@dataclass
class _Attempt:
    key: TaskKey
    run_dir: Path | None
    job_id: str | None = None
    job_name: str | None = None
    job_dir: Path | None = None
    submit_by: float = 0.0  # Unix time by which sbatch has surely answered
    offset: int = 0
    reported: bool = False
    done: bool = False
    gone_since: float | None = None
    stop_pending: bool = False
    waiting: str = ""  # why its job is PENDING (``pending_reason``), "" once it is not


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
        self.index = AttemptIndex(self.state_dir)
        self._attempts: dict[TaskKey, _Attempt] = {}
        self._last_status = float("-inf")

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
            attempts = self._announce(request)
            self._write(request)
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
            self._remember(attempt)

    def poll(self) -> list[TaskFact]:
        """Facts since the last call: runner events, each once, and the job-state fact of an
        attempt whose job or step ended without its EXITED event."""
        live = [a for a in self._attempts.values() if not a.done]
        facts = [fact for attempt in live for fact in self._read(attempt)]
        if live and time.monotonic() - self._last_status >= self.options.status_interval_s:
            self._last_status = time.monotonic()
            facts += self._check_jobs([a for a in live if not a.done])
        return facts

    def stop(self, keys: list[TaskKey]) -> None:
        """Cancel these attempts (scancel: SIGTERM, SIGKILL after KillWait). Idempotent;
        returns after the scancel calls; a step not started yet is cancelled when it shows.
        Each one's ``run.json`` loses its credential values first (``_scrub``)."""
        wanted = [a for k in keys if (a := self._find(k)) is not None and not a.done]
        for attempt in wanted:
            _scrub(attempt)
        for job_id in sorted({a.job_id for a in wanted if a.job_id}):
            of_job = [a for a in wanted if a.job_id == job_id]
            if self._whole_job(job_id, of_job):
                self._cancel(job_id)
            else:
                for attempt in of_job:
                    attempt.stop_pending = True
                self._cancel_steps(job_id)

    def waiting_reason(self, key: TaskKey) -> str:
        """Why the attempt's job waits in Slurm's queue (squeue ``%r`` of a PENDING job, in
        Slurm's word and plain words: ``states.pending_reason``), as of the last status
        check; "" when it does not wait (or is unknown here)."""
        attempt = self._find(key)
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
        attempt = self._find(key)
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
        attempts = [self._find(k) or self._remember(_Attempt(k, None)) for k in keys]
        try:
            for attempt in attempts:
                self._resolve(attempt)
            jobs = {a.job_id for a in attempts if a.job_id}
            states = self.commands.job_states(jobs) if jobs else {}
        except BackendError as exc:
            log.warning("slurm backend: cannot ask squeue while recovering: %s", exc)
            return [a.key for a in attempts if a.job_id]
        return [
            a.key for a in attempts if a.job_id and is_alive(states.get(a.job_id, (UNKNOWN, ""))[0])
        ]

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Those of ``keys`` surely never submitted (see the module docstring), so starting
        them now cannot run one twice. When Slurm cannot be asked, an attempt whose record
        has no job id counts as started."""
        return [key for key in keys if self._never_started(key)]

    def _never_started(self, key: TaskKey) -> bool:
        if key in self._attempts:
            return False
        attempt = self._load(key)
        if attempt is None:
            return True
        try:
            if self._resolve(attempt):
                return False
        except BackendError as exc:
            log.warning("slurm backend: cannot tell whether %s was submitted: %s", key, exc)
            return False
        return time.time() > attempt.submit_by and not _ran(attempt.run_dir)

    def _resolve(self, attempt: _Attempt) -> bool:
        """Find the job of an attempt whose record has no job id (the engine died around
        sbatch): by name and job folder in squeue, else by Slurm's output file in its job
        folder. Records the id found. Raises BackendError when squeue fails."""
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
        if attempt.key in self._attempts:
            self._remember(attempt)
        else:
            self._save(attempt)
        return True

    # ------------------------------------------------------------------ starting

    def _path_prepend(self, launch: TaskLaunch) -> list[str]:
        if self.options.container is not None:
            return []
        return runtime_path(runtime_for(launch.run.get("image"), self.pool.images), self.state_dir)

    def _announce(self, request: SlurmBatchRequest) -> list[_Attempt]:
        """Write each attempt's index record, without a job id, before anything is submitted
        (``unstarted``: no record means never submitted). Returns the attempts."""
        submit_by = time.time() + self.commands.timeout_s + SUBMIT_MARGIN_S
        attempts = [
            _Attempt(
                launch.key,
                Path(launch.run_dir),
                job_name=request.job_name,
                job_dir=request.job_dir,
                submit_by=submit_by,
            )
            for launch in request.launches
        ]
        for attempt in attempts:
            self._save(attempt)
        return attempts

    def _write(self, request: SlurmBatchRequest) -> None:
        request.job_dir.mkdir(parents=True, exist_ok=True)
        for launch in request.launches:
            run_dir = Path(launch.run_dir)
            _fresh_run_dir(run_dir)
            if launch.restart_in_place:
                _adopt_files(run_dir, self._earlier_run_dirs(launch.key, run_dir))
            _private_tmp(run_dir)
            run = request.runs[launch.key]
            write_private(run_dir / "run.json", run.model_dump_json())
        write_private(request.script_path, request.script)

    def _earlier_run_dirs(self, key: TaskKey, run_dir: Path) -> list[Path]:
        """Run folders of the task's earlier attempts, latest first (from their records,
        else beside ``run_dir``)."""
        found: list[Path] = []
        for retry in range(key.retry_id - 1, -1, -1):
            earlier = self._load(TaskKey(key.workflow_id, key.task, retry))
            found.append(
                earlier.run_dir if earlier and earlier.run_dir else run_dir.parent / str(retry)
            )
        return found

    def _remember(self, attempt: _Attempt) -> _Attempt:
        self._attempts[attempt.key] = attempt
        if attempt.job_id:
            self._save(attempt)
        return attempt

    def _save(self, attempt: _Attempt) -> None:
        """Write the attempt's index record (nothing for one without a run folder)."""
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

    def _find(self, key: TaskKey) -> _Attempt | None:
        """The attempt, from memory or from the index (started by an earlier object)."""
        if key in self._attempts:
            return self._attempts[key]
        attempt = self._load(key)
        if attempt is not None:
            self._attempts[key] = attempt
        return attempt

    def _load(self, key: TaskKey) -> _Attempt | None:
        """The attempt as its index record has it (None without one)."""
        record = self.index.read(key)
        if record is None:
            return None
        try:
            job_id, job_dir = record.get("job_id"), record.get("job_dir")
            return _Attempt(
                key,
                Path(record["run_dir"]),
                str(job_id) if job_id else None,
                record.get("job_name"),
                Path(job_dir) if job_dir else None,
                float(record.get("submit_by") or 0.0),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    # ------------------------------------------------------------------ observing

    def _read(self, attempt: _Attempt) -> list[TaskFact]:
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

    def _check_jobs(self, live: list[_Attempt]) -> list[TaskFact]:
        try:
            for attempt in live:
                self._resolve(attempt)
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

    def _ending_fact(
        self,
        attempt: _Attempt,
        states: dict[str, tuple[str, str]],
        steps: dict[str, dict[str, str]],
    ) -> list[TaskFact]:
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
        if attempt.stop_pending and attempt.key.task in job_steps:
            self._cancel(job_steps[attempt.key.task])
            attempt.stop_pending = False
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

    def _after_grace(self, attempt: _Attempt, state: str, why: str) -> list[TaskFact]:
        """``state`` (a key of ``SLURM_STATES``) decides the fact; ``why`` explains it."""
        now = time.monotonic()
        if attempt.gone_since is None:
            attempt.gone_since = now
        if now - attempt.gone_since < self.options.lost_grace_s:
            return []
        late = self._read(attempt)
        if attempt.done:
            return late
        return late + [
            self._gone(attempt, state, f"the task runner never reported its exit: {why}")
        ]

    def _gone(self, attempt: _Attempt, state: str, message: str) -> TaskFact:
        attempt.done = True
        _scrub(attempt)
        last = tail(attempt.run_dir / RUNNER_OUT) if attempt.run_dir else ""
        text = f"{message}: {last}" if last else message
        return TaskFact(attempt.key, fact_for_state(state), time.time(), None, text)

    # ------------------------------------------------------------------ stopping

    def _whole_job(self, job_id: str, stopping: list[_Attempt]) -> bool:
        live = {a.key for a in self._attempts.values() if a.job_id == job_id and not a.done}
        return live <= {a.key for a in stopping}

    def _cancel(self, target: str) -> None:
        try:
            self.commands.cancel(target)
        except BackendError as exc:
            log.warning("slurm backend: %s", exc)

    def _cancel_steps(self, job_id: str) -> None:
        try:
            steps = self.commands.steps([job_id]).get(job_id, {})
        except BackendError as exc:
            log.warning("slurm backend: cannot list the steps of job %s: %s", job_id, exc)
            return
        for attempt in self._attempts.values():
            if attempt.job_id == job_id and attempt.stop_pending and attempt.key.task in steps:
                self._cancel(steps[attempt.key.task])
                attempt.stop_pending = False


def _fresh_run_dir(run_dir: Path) -> None:
    """Make the run folder; set aside events of an earlier use."""
    run_dir.mkdir(parents=True, exist_ok=True)
    events = run_dir / EVENTS
    if events.exists():
        events.rename(run_dir / f"events.{time.time_ns()}.jsonl")


def _adopt_files(run_dir: Path, earlier: list[Path]) -> None:
    """RESTART in place: move each of ``ADOPTED`` (sandbox, ``{{output}}``) into ``run_dir``
    from the first of ``earlier`` (run folders, latest first) that has it; a folder
    ``run_dir`` already has is left alone (a start made again after an engine restart)."""
    for name in ADOPTED:
        found = next((d / name for d in earlier if (d / name).is_dir()), None)
        if found is not None and not (run_dir / name).exists():
            found.rename(run_dir / name)


def _private_tmp(run_dir: Path) -> None:
    """The task's private ``/tmp`` (``sandbox/root/tmp``, sticky and world-writable)."""
    tmp = run_dir / "sandbox" / "root" / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    tmp.chmod(0o1777)


def _ran(run_dir: Path | None) -> bool:
    """Whether a runner has left a trace in ``run_dir`` (its srun output or its events)."""
    return run_dir is not None and ((run_dir / RUNNER_OUT).exists() or (run_dir / EVENTS).exists())


def _job_of_output(job_dir: Path) -> str | None:
    """The job id in ``<job_dir>/slurm-<id>.out`` (written by Slurm once the job starts)."""
    ids = [p.name[len("slurm-") : -len(".out")] for p in job_dir.glob("slurm-*.out")]
    return max((j for j in ids if j.isdigit()), key=int, default=None)


def create(pool: Pool, home: Path) -> SlurmBackend:
    """Registry entry: the Slurm backend for ``pool`` with state under ``home``."""
    return SlurmBackend(pool, home)


def _scrub(attempt: _Attempt) -> None:
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
