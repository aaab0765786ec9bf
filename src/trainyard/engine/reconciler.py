"""The reconciler: the loop that turns backend facts into events, events into new states
(through the pure state machine), and actions into scheduler and backend calls.

Order of work in one ``step`` (write-ahead, so a killed engine never runs a task twice):
1. poll every backend for facts and feed them to the state machine, with a ``Tick``;
2. place queued gangs that fit now (``GroupPlaced`` events);
3. save every changed workflow in ONE transaction;
4. only then carry out the actions (start, stop, release), which may yield more events
   (a start that fails), handled in the same step.

``run_forever`` steps at once when woken (``wake``: a submit, a backend's notification of
new facts, the optional backend hook ``notify_facts``), else every ``poll_interval_s``, which
stays the upper bound between two steps. Each store of changed states bumps ``changes()``
and wakes ``wait_for_change`` (the server's long polls).

A retry's start waits for the earlier attempts of its tasks that were just stopped (the
group's peers, restarted with it under ``ignoreNonleadStatus: false``) to end: their final
checkpoint upload and their files are then complete, so the new attempts download the last
snapshot and a RESTART in place takes over a quiet sandbox. It starts anyway, with a warning,
after ``RETRY_START_WAIT_S``.

After a restart, ``Engine`` loads every unfinished workflow from the store (oldest first) and
redoes what the killed engine had stored but maybe not yet done:
- a workflow still PENDING gets its ``Submitted`` again (a no-op if its groups moved on);
- SCHEDULING gangs queue again in the order they entered the queue (the time they went
  SCHEDULING, then submission order, then spec order);
- running groups get their placements back; the backend says which of their attempts it
  never started (``Backend.unstarted``): those are started by the next ``step``, with
  the gang they were started with (same barrier), once that step has applied the facts the
  backend read (so none is started whose gang ended while no engine ran); the rest are
  adopted with ``recover``, and those no longer alive are reported LOST by the backend's
  next poll unless their exit was already written;
- attempts the store already holds as ended (cancelled, timed out, stopped with their lead,
  retried), of unfinished workflows and of those that ended in the last
  ``LEFTOVER_WINDOW_S``, are stopped where the backend still finds them alive: the killed
  engine may have stored their end but not yet stopped them. A retry of theirs that was
  never started waits for them to end, as above;
- the first ``step`` applies every fact the backend read (in the order they happened, see
  ``_in_time_order``) before any stored start is made or any timeout is checked.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainyard import backends
from trainyard.backends.base import Backend, FactKind, TaskFact, TaskKey, TaskLaunch
from trainyard.backends.facts import ENDING as _ENDING
from trainyard.engine import homestore
from trainyard.engine import machine as m
from trainyard.engine import retention, rules
from trainyard.engine.launch import InputUnavailable, LaunchContext, build_launches
from trainyard.engine.plan import build_state, default_exit_actions_of
from trainyard.engine.reasons import read_log_tail
from trainyard.engine.scheduler import (PRIORITY_RANK, Placement, Request, Scheduler,
                                        priority_rank, request_of)
from trainyard.engine.serialize import state_from_dict, state_to_dict
from trainyard.status import ExitCode, Status, WorkflowStatus
from trainyard.errors import BackendError, ConfigError, NotFoundError, RefusedError
from trainyard.backends.served import load_usable_pools
from trainyard.pools import Pool
from trainyard.runner.report import LOG, TaskLog
from trainyard.spec.api import reparse
from trainyard.spec.fields import name_key
from trainyard.spec.models import ExitAction, WorkflowSpec
from trainyard.store import Store, WorkflowRecord
from trainyard.store.credentials import CredentialVault

__all__ = ["Engine", "Submission"]

log = logging.getLogger("trainyard.engine")

RETRY_START_WAIT_S = 120.0
"""The longest a retry's start waits for its stopped earlier attempts to end."""

WAIT_REASONS_INTERVAL_S = 2.0
"""How often the scheduler's waiting reasons are read into the state (and stored when they
changed); a gang queued for less than this has none yet."""

LEFTOVER_WINDOW_S = 7 * 24 * 3600.0
"""How far back a restarted engine looks for ended workflows whose attempts may still run."""


@dataclass
class Submission:
    """A validated workflow ready to be stored and run.

    ``reparse``: the keyword arguments of ``spec.reparse`` (``spec_path``, ``files``,
    ``set_env``, ``labels``; JSON values) that turn ``spec_text``, the rendered text, back
    into ``spec``. When given, the text is the one copy of the spec that is stored, and
    ``spec`` is rebuilt from it after a restart; without it (``spec_text`` may then be
    anything), ``spec`` is stored as JSON beside the text.
    """

    spec: WorkflowSpec
    spec_text: str
    user: str
    pool: Pool
    labels: dict[str, str] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    reparse: dict[str, Any] | None = None


def _rank_of(source: dict[str, Any]) -> int:
    """The priority rank of a workflow from what its record keeps: the ``priority`` of the
    request it was submitted with (``server`` stores it there), NORMAL when none."""
    request = source.get("request") if isinstance(source, dict) else None
    return priority_rank(request.get("priority") if isinstance(request, dict) else None)


@dataclass
class _Live:
    """An unfinished workflow the engine is driving."""

    state: m.WorkflowState
    spec: WorkflowSpec
    pool: str
    user: str | None = None
    rank: int = PRIORITY_RANK["NORMAL"]
    """Its priority's rank (``scheduler.PRIORITY_RANK``): where its gangs queue."""


@dataclass(frozen=True)
class _Unstarted:
    """A start the killed engine stored but never made: ``action`` is the gang's start as it
    was asked (for its barrier), ``keys`` the attempts of it that must still be started."""

    workflow_id: str
    action: m.StartTasks
    keys: frozenset[TaskKey]


@dataclass
class _Deferred:
    """A retry's start held until ``waiting`` (stopped earlier attempts) have ended; only
    the attempts ``only`` of it when given (a start that a killed engine had made in part)."""

    workflow_id: str
    action: m.StartTasks
    waiting: set[TaskKey]
    deadline: float  # time.monotonic()
    only: frozenset[TaskKey] | None = None


def _fact_to_event(fact: TaskFact, tail: Callable[[], tuple[str, ...]] = tuple) -> m.Event:
    """The state machine's event for ``fact``; ``tail()`` gives the attempt's last log lines,
    read only for an attempt that was lost or exited with a code other than 0."""
    key, t = fact.key, fact.time_s
    if fact.kind is FactKind.INITIALIZING:
        return m.TaskInitializing(t, key.task, key.retry_id)
    if fact.kind is FactKind.RUNNING:
        return m.TaskRunning(t, key.task, key.retry_id)
    if fact.kind is FactKind.LOST:
        return m.TaskLost(t, key.task, key.retry_id, fact.message, log_tail=tail())
    code = fact.exit_code if fact.kind is FactKind.EXITED else int(ExitCode.START_ERROR)
    code = int(code if code is not None else ExitCode.UNKNOWN)
    return m.TaskExited(t, key.task, key.retry_id, code, fact.message, fact.failure,
                        log_tail=tail() if code != 0 else ())


class Engine:
    """Drives every unfinished workflow of one store.

    Args:
        store: the store (the one truth).
        home: ``$TRAINYARD_HOME``; runs live under ``home/runs/<workflow>/<task>/<retry>``.
        pools: pools by name (default: ``backends.served.load_usable_pools()``).
        spec_loader: rebuilds a ``WorkflowSpec`` from a stored record's ``source`` after a
            restart.

    Thread safety: public methods take one lock; ``run_forever`` calls ``step`` in a loop.
    """

    def __init__(
        self,
        store: Store,
        home: Path,
        *,
        pools: dict[str, Pool] | None = None,
        spec_loader: Callable[[WorkflowRecord], WorkflowSpec] | None = None,
        backend_factory: Callable[[Pool, Path], Backend[Any]] | None = None,
        poll_interval_s: float = 0.05,
    ) -> None:
        self.store = store
        self.home = home
        self.credentials = CredentialVault(store, home)
        """Users' credentials (``store.credentials``): handed to their tasks at launch."""
        self.pools = pools if pools is not None else load_usable_pools()
        self.poll_interval_s = poll_interval_s
        self._spec_loader = spec_loader or _spec_from_source
        self._backend_factory = backend_factory or _default_backend
        self._lock = threading.RLock()
        self._live: dict[str, _Live] = {}
        self._pool_name: dict[str, str] = {}
        self._schedulers: dict[str, Scheduler] = {}
        self._backends: dict[str, Backend[Any]] = {}
        self._dirty: set[str] = set()
        self._pending: dict[str, list[m.Event]] = {}  # accepted, handled by the next step
        self._unstarted: list[_Unstarted] = []  # found by _resume, started by the next step
        self._stopping: set[TaskKey] = set()  # stops sent, no ending fact seen yet
        self._ended_now: set[TaskKey] = set()  # ending facts of the step under way
        self._deferred: list[_Deferred] = []
        self._running_loop = False  # True while run_forever drives the steps
        self._wake = threading.Event()  # set by submit and by backends' fact notifications
        self._changed = threading.Condition()
        self._changes = 0  # how many times _flush stored changed states
        self._reasons_due_s = 0.0  # time.monotonic() of the next _note_waiting
        homestore.bind_home(home, store)  # before anything of the home is used (issue 24)
        self._resume()

    # ------------------------------------------------------------------ public API

    def submit(self, sub: Submission) -> WorkflowRecord:
        """Store a workflow; the loop's next ``step`` starts it (so a submit answers at once,
        without waiting for processes to start). Nothing is stored if building its state
        fails. Returns the stored record (status PENDING).

        Raises:
            RefusedError: a group can never be placed on the pool, even empty (its tasks
                cannot be packed onto the nodes together): it would wait forever.
        """
        self.pools.setdefault(sub.pool.name, sub.pool)
        self._refuse_unplaceable(sub)

        def make_state(workflow_id: str) -> tuple[str, dict[str, Any]]:
            state = build_state(workflow_id, sub.spec, max_retries=sub.pool.max_retries,
                                default_exit_actions=default_exit_actions_of(sub.pool),
                                now_s=time.time())
            return state.status.value, state_to_dict(state)

        source = {**sub.source, **_spec_source(sub)}
        with self._lock:
            record = self.store.create_workflow(
                name=sub.spec.name, pool=sub.pool.name, submitted_by=sub.user,
                labels=sub.labels, spec_text=sub.spec_text, source=source, make_state=make_state,
            )
            self._track(record.id, _Live(state_from_dict(record.state), sub.spec, sub.pool.name,
                                         sub.user, _rank_of(source)))
            self._pending.setdefault(record.id, []).append(m.Submitted(time.time()))
        self.wake()
        return record

    def wake(self) -> None:
        """Ask ``run_forever`` for a step now rather than at its next tick (a submit, a
        backend's new fact). Returns at once; wake-ups before the step are one step, and a
        loop backing off after failed steps is not hurried."""
        self._wake.set()

    def changes(self) -> int:
        """A counter that grows each time changed workflow states are stored; pass it to
        ``wait_for_change``."""
        with self._changed:
            return self._changes

    def wait_for_change(self, seen: int, timeout_s: float) -> bool:
        """Block until states were stored after ``changes()`` returned ``seen``, or
        ``timeout_s`` passed. Returns whether they were."""
        with self._changed:
            return self._changed.wait_for(lambda: self._changes != seen, timeout=timeout_s)

    def _refuse_unplaceable(self, sub: Submission) -> None:
        """RefusedError for a gang that the scheduler could not place on the empty pool
        (``spec.poolfit`` already refused one that asks more than a node, or than the pool in
        total; this is the rest: tasks that fit one by one but cannot be packed together)."""
        scheduler = Scheduler(sub.pool)
        for group in sub.spec.groups:
            requests = {t.name: request_of(sub.spec.resource_of(t)) for t in group.tasks}
            if not scheduler.fits_empty(requests):
                raise RefusedError(
                    f"group {group.name!r}: its {len(group.tasks)} tasks start together but "
                    f"cannot be placed together on pool {sub.pool.name!r} even when it is "
                    f"empty ({len(sub.pool.nodes)} nodes); ask for less per task or use fewer "
                    "tasks")

    def preview(self, sub: Submission) -> list[tuple[str, str]]:
        """What submitting ``sub`` now would hand its pool's backend, for ``--dry-run``: per
        group, in plan order, the backend's own rendering of the group's first start
        (``dry_run(launches)``: the sbatch command and script on Slurm). Every task is on the
        first node it could get; ids and paths are those the next submission would get.
        Stores nothing, starts nothing. A group whose rendering is empty is left out."""
        backend = self._backends.get(sub.pool.name) or self._backend_factory(sub.pool, self.home)
        wid = self.store.peek_workflow_id(sub.spec.name)
        state = build_state(wid, sub.spec, max_retries=sub.pool.max_retries,
                            default_exit_actions=default_exit_actions_of(sub.pool),
                            now_s=time.time())
        previews = []
        for group in sub.spec.groups:
            names = [t.name for t in group.tasks]
            ctx = LaunchContext(
                home=self.home, workflow_id=wid, spec=sub.spec, state=state,
                placements={n: Placement(sub.pool.nodes[0].name if sub.pool.nodes else "")
                            for n in names},
                backend=backend, pool=sub.pool, upstream_output=self._preview_output(wid))
            action = m.StartTasks(group.name, tuple((n, 0) for n in names))
            text = backend.dry_run(build_launches(ctx, action))
            if text:
                previews.append((group.name, text))
        return previews

    def _preview_output(self, wid: str) -> Callable[[str, str], Path]:
        def output(ref: str, current: str) -> Path:
            upstream, _, task = ref.rpartition(":")
            if upstream and upstream != wid:
                return self._upstream_output(ref, current)
            return self.home / "runs" / wid / task / "0" / "output"
        return output

    def cancel(self, workflow_id: str, *, force: bool = False) -> None:
        """Cancel a workflow: every process stopped, status FAILED_CANCELED. Idempotent;
        a finished workflow is left as it is. What the backend already saw happen is applied
        first (one ``step``): a workflow whose last task had already exited is recorded as it
        ended, not as cancelled. ``force`` (OSMO's ``workflow cancel --force``, "Force cancel
        task group pods in the cluster"): its attempts are stopped with no grace period
        (``Backend.kill``), those of an earlier cancel too. Raises NotFoundError for an
        unknown id."""
        with self._lock:
            if workflow_id in self._live:
                self.step()
            if workflow_id not in self._live:
                self.store.get_workflow(workflow_id)  # raises NotFoundError
                return
            self._process({workflow_id: [m.CancelRequested(time.time())]})
            if force:
                self._kill(workflow_id)

    def _kill(self, workflow_id: str) -> None:
        """Stop at once (``Backend.kill``) the attempts of the workflow still stopping."""
        keys = [k for k in self._stopping if k.workflow_id == workflow_id]
        if not keys:
            return
        try:
            backend = self._backend_of(workflow_id)
        except (BackendError, ConfigError):
            return
        backend.kill(keys)

    def restart(self, workflow_id: str) -> None:
        """Run a failed workflow's groups that did not complete again (new retry ids), keeping
        the completed ones and their outputs (OSMO ``workflow restart``).

        Raises:
            NotFoundError: unknown workflow.
            RefusedError: it is still running, or it COMPLETED (nothing to restart).
        """
        with self._lock:
            record = self.store.get_workflow(workflow_id)
            state = state_from_dict(record.state)
            if workflow_id in self._live or not state.status.is_terminal():
                raise RefusedError(f"workflow {workflow_id} is {state.status}; only a finished, "
                                  "failed workflow can be restarted")
            if state.status is WorkflowStatus.COMPLETED:
                raise RefusedError(f"workflow {workflow_id} COMPLETED; submit it again instead "
                                  f"(`trainyard workflow submit {workflow_id}`)")
            self._track(workflow_id, _Live(state, self._spec_loader(record), record.pool,
                                           record.submitted_by, _rank_of(record.source)))
            self._process({workflow_id: [m.Restarted(time.time())]})

    def delete(self, workflow_ids: list[str], *, keep_records: bool = False) -> None:
        """Delete ended workflows: their store rows (unless ``keep_records``) and their run
        folders (``home/runs/ID``: logs, task folders, ``{{output}}`` folders); never what
        they uploaded (datasets, output URLs). All of them or none: every id is checked
        before anything is removed. Who may delete is the caller's check.

        Raises:
            NotFoundError: an unknown id.
            RefusedError: one has not ended (cancel it first), an attempt of it still runs
                (it is stopped now; delete again once it is gone), or a file system is
                mounted in its run folder.
        """
        with self._lock:
            records = [self.store.get_workflow(wid) for wid in dict.fromkeys(workflow_ids)]
            running = [r for r in records if r.id in self._live or r.end_time_s is None]
            if running:
                r = running[0]
                raise RefusedError(
                    f"workflow {r.id} is {self.state(r.id).status.value}; only an ended workflow "
                    f"can be deleted: cancel it first (`trainyard workflow cancel {r.id}`)")
            self._refuse_if_still_running(records)
            folders = [self.home / "runs" / r.id for r in records]
            mounted = [point for folder in folders for point in retention.mounts_under(folder)]
            if mounted:
                raise RefusedError(f"file systems are mounted in run folders to delete "
                                   f"({', '.join(mounted)}); unmount them first")
            if not keep_records:
                self.store.delete_workflows([r.id for r in records])
                self._forget(records)
        for folder in folders:
            retention.remove_run_folder(folder)

    def _forget(self, records: list[WorkflowRecord]) -> None:
        """Let each pool's backend drop what it keeps of deleted workflows
        (``Backend.forget``)."""
        for record in records:
            if record.pool in self.pools:
                self._pool_backend(record.pool).forget(record.id)

    def _refuse_if_still_running(self, records: list[WorkflowRecord]) -> None:
        """Stop the attempts of these ended workflows that the backend still finds alive
        (as ``_stop_leftovers`` does), and refuse while there are any."""
        by_pool: dict[str, list[TaskKey]] = {}
        for record in records:
            keys = _ended_attempts(record.id, state_from_dict(record.state))
            if keys and record.pool in self.pools:
                by_pool.setdefault(record.pool, []).extend(keys)
        alive: list[TaskKey] = []
        for pool, keys in by_pool.items():
            backend = self._pool_backend(pool)
            found = backend.recover(keys)
            if found:
                backend.stop(found)
                alive += found
        if alive:
            raise RefusedError(
                "attempts of ended workflows still run and are being stopped now: "
                + ", ".join(f"{k.workflow_id}/{k.task}/{k.retry_id}" for k in alive)
                + "; delete again in a few seconds")

    def state(self, workflow_id: str) -> m.WorkflowState:
        """The current state (live or stored). Raises NotFoundError."""
        with self._lock:
            if workflow_id in self._live:
                return self._live[workflow_id].state
        return state_from_dict(self.store.get_workflow(workflow_id).state)

    def usage(self, pool_name: str) -> dict[str, dict[str, Any]]:
        """What placed tasks use of each node of a pool: cpu, gpu, memory_bytes, storage_bytes."""
        with self._lock:
            scheduler = self._schedulers.get(pool_name)
            if scheduler is None:
                return {}
            return {
                name: {"cpu": u.cpu, "gpu": len(u.gpu_slots), "memory_bytes": u.memory_bytes,
                       "storage_bytes": u.storage_bytes}
                for name, u in scheduler.usage.items()
            }

    def task_entry(self, pool: str, key: TaskKey) -> dict[str, Any]:
        """How to enter the running attempt ``key`` on ``pool`` (``Backend.entry``:
        ``workflow exec``).

        Raises:
            RefusedError: the pool's backend cannot enter a task, or refuses (see the hook).
        """
        backend = self._backends.get(pool)  # a running task's pool has one; none is made here
        if backend is None:
            raise RefusedError(f"the engine runs nothing on pool {pool} now")
        return dict(backend.entry(key))

    def spec_of(self, record: WorkflowRecord) -> WorkflowSpec:
        """The parsed spec a stored workflow runs (as the engine rebuilds it after a restart).

        Raises:
            SpecError: the stored spec no longer parses.
        """
        return self._spec_loader(record)

    def run_dir(self, workflow_id: str, task: str, retry_id: int) -> Path:
        """Folder of one task attempt (its log, events and sandbox state)."""
        return self.home / "runs" / workflow_id / task / str(retry_id)

    def step(self) -> None:
        """One pass of the loop (see the module docstring)."""
        with self._lock:
            events: dict[str, list[m.Event]] = {wid: [] for wid in self._live}
            for wid, pending in self._pending.items():
                events.setdefault(wid, []).extend(pending)
            self._pending.clear()
            facts = _in_time_order(self._poll())
            self._ended_now = {f.key for f in facts if f.kind in _ENDING}
            self._stopping -= self._ended_now
            for fact in facts:
                if fact.key.workflow_id in events:
                    self._log_backend_reason(fact)
                    events[fact.key.workflow_id].append(self._event_of(fact))
            for wid, event in self._start_deferred():
                events.setdefault(wid, []).append(event)
            now = time.time()
            for wid in events:
                events[wid].append(m.Tick(now))
            self._process(events)
            # After the facts: an attempt whose gang ended while no engine ran (a peer's exit
            # read just now) is not started at all.
            refused: dict[str, list[m.Event]] = {}
            for wid, event in self._start_unstarted():
                refused.setdefault(wid, []).append(event)
            if refused:
                self._process(refused)

    def _event_of(self, fact: TaskFact) -> m.Event:
        """``fact`` as an event, with the attempt's log tail (``task.log`` in its run folder)
        when it failed; none for an attempt already ended in the state (stopped with its
        gang or cancelled: its exit changes nothing, and a cancel of thousands of tasks
        must not read thousands of logs)."""
        key = fact.key
        live = self._live.get(key.workflow_id)
        task = live.state.tasks.get(key.task) if live is not None else None
        if task is None or task.retry_id != key.retry_id or task.status.is_terminal():
            return _fact_to_event(fact)
        path = self.run_dir(key.workflow_id, key.task, key.retry_id) / LOG
        return _fact_to_event(fact, lambda: read_log_tail(path, key.task))

    def wait(self, workflow_id: str, timeout_s: float | None = None) -> WorkflowRecord:
        """Block until the workflow is finished (driven by ``run_forever`` in another thread,
        or by this call when none runs). Returns the stored record."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                if workflow_id not in self._live:
                    return self.store.get_workflow(workflow_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"workflow {workflow_id} still running after {timeout_s} s")
            if not self._running_loop:
                self.step()
            time.sleep(self.poll_interval_s)

    def run_forever(self, stop: threading.Event) -> None:
        """Call ``step`` until ``stop`` is set: at once when woken (``wake``: a submit, a
        backend's fact notification), else every ``poll_interval_s`` (the tick, the upper
        bound between two steps: facts of a backend without notifications, timeouts,
        deferred starts). After failed steps, at doubling intervals (``_step_delay_s``), not
        hurried by wake-ups. ``stop`` is seen within ``poll_interval_s``."""
        self._running_loop = True
        failures = 0
        try:
            while not stop.is_set():
                self._wake.clear()  # a wake-up from now on makes the next step
                started = time.monotonic()
                try:
                    self.step()
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - the loop must survive one bad step
                    failures += 1
                    _log_failed_step(failures, exc)
                if failures == 0:
                    self._pause_after_step(stop, time.monotonic() - started)
                self._pause(stop, _step_delay_s(self.poll_interval_s, failures),
                            wakeable=failures == 0)
        finally:
            self._running_loop = False

    def _pause_after_step(self, stop: threading.Event, step_s: float) -> None:
        """After a step that took ``step_s``, wait as long again (at most the tick) before a
        wake-up may start the next one: under a stream of facts (hundreds of tasks ending a
        second) the wake-ups of that time become one step, and stepping takes at most about
        half a core, while a single fact still waits no more than one step's duration."""
        rest_s = min(step_s * STEP_REST_RATIO, self.poll_interval_s)
        if rest_s > 0:
            stop.wait(rest_s)

    def _pause(self, stop: threading.Event, delay_s: float, *, wakeable: bool) -> None:
        """Wait ``delay_s``, or less: until ``wake`` (when ``wakeable``) or ``stop``."""
        deadline = time.monotonic() + delay_s
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            slice_s = min(remaining, self.poll_interval_s)
            if wakeable:
                if self._wake.wait(slice_s):
                    return
            else:
                stop.wait(slice_s)

    def replace_pools(self, pools: dict[str, Pool]) -> list[str]:
        """Serve ``pools`` from now on (``pools.yaml`` was edited), without a restart.

        A pool that unfinished workflows use keeps its current definition while any of them
        runs or waits (its scheduler holds their placements and its backend their
        processes): its name is returned, and the caller offers the edit again later. A
        pool that changed or went away and is idle loses its scheduler and its backend
        (closed), so the next workflow on it gets ones built from the new definition.

        Returns:
            The names of the pools kept as they were because workflows use them.
        """
        with self._lock:
            busy = {self._pool_name[wid] for wid in self._live}
            result, kept = dict(pools), []
            for name, old in self.pools.items():
                if pools.get(name) == old:
                    continue
                if name in busy:
                    result[name] = old
                    kept.append(name)
                    continue
                self._schedulers.pop(name, None)
                backend = self._backends.pop(name, None)
                if backend is not None:
                    backend.close()
            self.pools = result
            return sorted(kept)

    def close(self) -> None:
        """Close and forget backends (their tasks keep running; a new Engine recovers them)."""
        for backend in self._backends.values():
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - closing one must not keep the others open
                log.exception("closing backend %s", backend.name)
        self._backends.clear()

    # ------------------------------------------------------------------ the loop

    def _process(self, events: dict[str, list[m.Event]]) -> None:
        """Apply events and place gangs, store, act; again until nothing more happens (a
        RequestPlacement carried out is placed in the next round, not the next step)."""
        while True:
            actions = self._apply_all(events) + self._place_ready()
            self._flush()
            if not actions:
                return
            events = self._carry_out(actions)

    def _apply_all(self, events: dict[str, list[m.Event]]) -> list[tuple[str, m.Action]]:
        actions: list[tuple[str, m.Action]] = []
        for wid, evs in events.items():
            for ev in evs:
                actions += self._apply(wid, ev)
        return actions

    def _apply(self, wid: str, event: m.Event) -> list[tuple[str, m.Action]]:
        live = self._live.get(wid)
        if live is None:
            return []
        new_state, actions = rules.transition(live.state, event)
        if new_state is not live.state:
            live.state = new_state
            self._dirty.add(wid)
        return [(wid, a) for a in actions]

    def _place_ready(self) -> list[tuple[str, m.Action]]:
        actions: list[tuple[str, m.Action]] = []
        for scheduler in self._schedulers.values():
            for (wid, group), placements in scheduler.place_ready():
                nodes = {task: p.node for task, p in placements.items()}
                slots = {task: p.gpu_slots for task, p in placements.items()}
                actions += self._apply(wid, m.GroupPlaced(time.time(), group, nodes, slots))
        self._note_waiting()
        return actions

    def _note_waiting(self) -> None:
        """Every ``WAIT_REASONS_INTERVAL_S``: give each gang queued at least that long its
        scheduler's waiting reason (``GroupWaiting``; stored only when it changed)."""
        now = time.monotonic()
        if now < self._reasons_due_s:
            return
        self._reasons_due_s = now + WAIT_REASONS_INTERVAL_S
        wall = time.time()
        self._note_backend_waiting(wall)
        for scheduler in self._schedulers.values():
            if not scheduler.queued():
                continue
            for (wid, group), reason in scheduler.waiting_reasons().items():
                live = self._live.get(wid)
                state = live.state.groups.get(group) if live is not None else None
                if state is None or state.waiting_reason == reason:
                    continue
                since = state.scheduling_since_s
                if since is None or wall - since >= WAIT_REASONS_INTERVAL_S:
                    self._apply(wid, m.GroupWaiting(wall, group, reason))

    def _note_backend_waiting(self, wall_s: float) -> None:
        """Each placed gang none of whose tasks started gets its backend's words for why
        (``Backend.waiting_reason`` of its tasks: the first task that has some, named),
        or "" once there are none (``GroupWaiting``; stored only when it changed)."""
        for wid, live in list(self._live.items()):
            waiting = [g for g in live.state.groups.values()
                       if g.status is Status.INITIALIZING
                       and all(live.state.tasks[t].start_time_s is None for t in g.tasks)]
            if not waiting:
                continue
            backend = self._backend_of(wid)
            for group in waiting:
                reason = _backend_reason(backend, wid, group, live.state)
                if reason != (group.waiting_reason or ""):
                    self._apply(wid, m.GroupWaiting(wall_s, group.name, reason))

    def _flush(self) -> None:
        if not self._dirty:
            return
        updates = {}
        for wid in self._dirty:
            st = self._live[wid].state
            updates[wid] = (st.status.value, st.end_time_s, state_to_dict(st))
        self.store.save_states(updates)
        self._dirty.clear()
        for wid, (_status, end_time_s, _state) in updates.items():
            if end_time_s is not None:  # finished: no longer driven
                del self._live[wid]
        with self._changed:
            self._changes += 1
            self._changed.notify_all()

    def _carry_out(self, actions: list[tuple[str, m.Action]]) -> dict[str, list[m.Event]]:
        """Carry out ``actions`` in order; a run of consecutive starts goes to the backends
        together (``_start_many``), every other action after the starts before it."""
        follow_up: dict[str, list[m.Event]] = {}
        starts: list[tuple[str, m.StartTasks]] = []
        for wid, action in actions:
            if isinstance(action, m.StartTasks):
                starts.append((wid, action))
                continue
            self._add_events(follow_up, self._start_many(starts))
            starts = []
            self._add_events(follow_up, [(wid, self._carry_out_one(wid, action))])
        self._add_events(follow_up, self._start_many(starts))
        return follow_up

    @staticmethod
    def _add_events(into: dict[str, list[m.Event]],
                    events: list[tuple[str, m.Event | None]]) -> None:
        for wid, event in events:
            if event is not None:
                into.setdefault(wid, []).append(event)

    def _start_many(self, starts: list[tuple[str, m.StartTasks]]) -> list[tuple[str, m.Event | None]]:
        """Start these gangs (retries held back as ``_carry_out_one`` holds them), one ``start_group``
        each, in order. Each gang's outcome is what ``_start`` would give it: None, or
        GroupStartFailed. (Several gangs in one call of a backend's ``start_groups`` was
        measured slower on the local backend: 64-74 against 84-86 tasks/s for 1,000 one-task
        groups, its launcher's CPU per task +2 ms; docs/benchmarks-history.md "Batched starts
        turned off".)"""
        ready: list[tuple[str, m.StartTasks]] = []
        for wid, action in starts:
            if self._earlier_stopping(wid, action):
                self._carry_out_one(wid, action)  # held back (a _Deferred)
            else:
                ready.append((wid, action))
        by_backend: dict[int, list[tuple[int, Backend[Any], list[TaskLaunch]]]] = {}
        outcome: dict[int, m.Event | None] = {}
        for index, (wid, action) in enumerate(ready):
            made = self._launches(wid, action)
            if isinstance(made, tuple):
                by_backend.setdefault(id(made[0]), []).append((index, *made))
            else:
                outcome[index] = made
        for gangs in by_backend.values():
            for (index, backend, launches), error in zip(gangs, _start_groups(gangs), strict=True):
                wid, action = ready[index]
                outcome[index] = self._start_failed(wid, action, backend, launches, error)
        return [(wid, outcome.get(index)) for index, (wid, _action) in enumerate(ready)]

    def _carry_out_one(self, wid: str, action: m.Action) -> m.Event | None:
        if isinstance(action, m.RequestPlacement):
            self._enqueue(wid, action.group)
        elif isinstance(action, m.StartTasks):
            waiting = self._earlier_stopping(wid, action)
            if waiting:
                self._deferred.append(_Deferred(wid, action, waiting,
                                                time.monotonic() + RETRY_START_WAIT_S))
                return None
            return self._start(wid, action)
        elif isinstance(action, m.StopTasks):
            for task, retry_id in action.tasks if action.reason else ():
                self._task_log(TaskKey(wid, task, retry_id),
                               f"{action.reason}: the task is stopped")
            self._stop(wid, action.tasks)
        elif isinstance(action, m.ReleaseGroup):
            self._scheduler_of(wid).release((wid, action.group))
        return None

    # ------------------------------------------------------------------ actions

    def _requests(self, live: _Live, group: str) -> dict[str, Request]:
        spec_group = next(g for g in live.spec.groups if g.name == group)
        return {t.name: request_of(live.spec.resource_of(t)) for t in spec_group.tasks}

    def _enqueue(self, wid: str, group: str) -> None:
        """Queue the gang; its age (for backfill) counts from when it went SCHEDULING, also
        across an engine restart."""
        live = self._live.get(wid)
        if live is not None:
            since_s = live.state.groups[group].scheduling_since_s
            waited_s = max(0.0, time.time() - since_s) if since_s is not None else 0.0
            self._scheduler_of(wid).enqueue((wid, group), self._requests(live, group),
                                            now_s=time.monotonic() - waited_s, rank=live.rank)

    def _start(self, wid: str, action: m.StartTasks,
               only: frozenset[TaskKey] | None = None) -> m.Event | None:
        """Start ``action``'s attempts (``only`` those keys, when given; the launches are
        built for the whole action all the same, so a gang's barrier is the same). Returns
        GroupStartFailed when the backend refuses, else None."""
        made = self._launches(wid, action, only)
        if not isinstance(made, tuple):
            return made
        backend, launches = made
        error: BackendError | None = None
        try:
            backend.start_group(launches)
        except BackendError as exc:
            error = exc
        return self._start_failed(wid, action, backend, launches, error)

    def _launches(self, wid: str, action: m.StartTasks, only: frozenset[TaskKey] | None = None,
                  ) -> tuple[Backend[Any], list[TaskLaunch]] | m.Event | None:
        """The backend and the launches of ``action``'s start (``only`` those keys, when
        given); None for a workflow no longer driven, GroupStartFailed when its pool has no
        usable backend."""
        live = self._live.get(wid)
        if live is None:
            return None
        try:
            backend = self._backend_of(wid)
        except (BackendError, ConfigError) as exc:  # e.g. a pool option its backend refuses
            reason = f"the pool {self._pool_of(wid).name!r} has no usable backend: {exc}"
            log.warning("workflow %s group %s did not start: %s", wid, action.group, reason)
            return m.GroupStartFailed(time.time(), action.group, reason, backend_error=True)
        placements = self._scheduler_of(wid).placement_of((wid, action.group))
        ctx = LaunchContext(
            home=self.home, workflow_id=wid, spec=live.spec, state=live.state,
            placements=placements, backend=backend, pool=self._pool_of(wid),
            upstream_output=self._upstream_output, user=live.user,
            credentials=self._credentials_of(live.user, live.spec, action.group),
            data_credentials=self.credentials.data_payloads(live.user) if live.user else [],
            registry_credentials=self._registry_credentials_of(live.user, live.spec, action.group),
        )
        launches = build_launches(ctx, action)
        if only is not None:
            launches = [launch for launch in launches if launch.key in only]
        return backend, launches

    def _registry_credentials_of(self, user: str | None, spec: WorkflowSpec,
                                 group: str) -> list[dict[str, str]]:
        """The submitter's REGISTRY credentials, when a task of the group names an image
        (decrypted only then)."""
        images = [t.image for g in spec.groups if g.name == group for t in g.tasks if t.image]
        if not images or user is None:
            return []
        return self.credentials.registry_payloads(user)

    def _credentials_of(self, user: str | None, spec: WorkflowSpec,
                        group: str) -> dict[str, tuple[str, dict[str, str]]]:
        """The submitter's credentials that the group's tasks name, decrypted (``{name:
        (type, payload)}``); a name they no longer have is absent (the runner then fails
        the task with OSMO's words)."""
        names = [n for g in spec.groups if g.name == group for t in g.tasks
                 for n in t.credentials]
        if not names or user is None:
            return {}
        return self.credentials.payloads(user, names)

    def _start_failed(self, wid: str, action: m.StartTasks, backend: Backend[Any],
                      launches: list[TaskLaunch], error: BackendError | None) -> m.Event | None:
        """What a start's outcome yields: None when it started; else the reason in each
        task's log and GroupStartFailed."""
        if error is None:
            return None
        log.warning("workflow %s group %s did not start: %s", wid, action.group, error)
        for launch in launches:
            self._task_log(launch.key, f"the {backend.name} backend could not start the "
                                       f"task: {error}")
        return m.GroupStartFailed(time.time(), action.group, str(error), backend_error=True)

    def _log_backend_reason(self, fact: TaskFact) -> None:
        """Write why an attempt ended to its task log when the backend, not the runner, saw
        it end (LOST, START_ERROR: the runner could not write it), and only if the fact will
        end the current attempt (a stopped or stale one is not reported as failed)."""
        if fact.kind not in (FactKind.LOST, FactKind.START_ERROR) or not fact.message:
            return
        live = self._live.get(fact.key.workflow_id)
        task = live.state.tasks.get(fact.key.task) if live else None
        if task is None or task.retry_id != fact.key.retry_id or task.status.is_terminal():
            return
        self._task_log(fact.key, f"the {self._backend_of(fact.key.workflow_id).name} backend "
                                 f"reports the task {fact.kind.value}: {fact.message}")

    def _task_log(self, key: TaskKey, text: str) -> None:
        """Append one trainyard line to the attempt's task log (best effort: a log that
        cannot be written is reported in server.log, the reason stays in the store)."""
        try:
            run_dir = self.run_dir(key.workflow_id, key.task, key.retry_id)
            run_dir.mkdir(parents=True, exist_ok=True)
            task_log = TaskLog(run_dir, key.task)
            try:
                for line in text.splitlines() or [""]:  # sbatch's stderr may have several
                    task_log.runner(line)
            finally:
                task_log.close()
        except OSError as exc:
            log.warning("cannot write the task log of %s/%s/%s: %s", key.workflow_id, key.task,
                        key.retry_id, exc)

    def _stop(self, wid: str, tasks: tuple[tuple[str, int], ...]) -> None:
        keys = [TaskKey(wid, task, retry) for task, retry in tasks]
        try:
            backend = self._backend_of(wid)
        except (BackendError, ConfigError):
            return  # no backend could be made, so none of these ever started
        self._stopping.update(k for k in keys if k not in self._ended_now)
        backend.stop(keys)

    def _earlier_stopping(self, wid: str, action: m.StartTasks) -> set[TaskKey]:
        """Earlier attempts of ``action``'s tasks that were stopped and have not ended."""
        newest = dict(action.tasks)
        return {k for k in self._stopping
                if k.workflow_id == wid and k.task in newest and k.retry_id < newest[k.task]}

    def _start_deferred(self) -> list[tuple[str, m.Event]]:
        """Make the held retry starts whose stopped attempts have ended (or waited too long);
        returns the events of those the backend refused."""
        now, events, held = time.monotonic(), [], []
        for item in self._deferred:
            item.waiting &= self._stopping
            if item.waiting and now < item.deadline:
                held.append(item)
                continue
            if item.waiting:
                log.warning("workflow %s group %s: starting the retry although %d stopped "
                            "attempt(s) did not end within %.0f s", item.workflow_id,
                            item.action.group, len(item.waiting), RETRY_START_WAIT_S)
            live = self._live.get(item.workflow_id)
            keys = item.only if item.only is not None else [
                TaskKey(item.workflow_id, t, r) for t, r in item.action.tasks]
            keys = frozenset(k for k in keys if live and _still_to_start(live.state, k))
            event = self._start(item.workflow_id, item.action, only=keys) if keys else None
            if event is not None:
                events.append((item.workflow_id, event))
        self._deferred = held
        return events

    def _upstream_output(self, ref: str, current_wid: str) -> Path:
        """Output folder of the completed attempt of a task (``TASK`` or ``WORKFLOW_ID:TASK``).

        A task of this workflow has COMPLETED when its downstream starts (the DAG says so).
        A task of another workflow is read only if its last attempt COMPLETED (issue 6); the
        server already refused, at submit, an unknown workflow or another user's.

        Raises:
            NotFoundError: this workflow has no such task (a bug: the spec checks refuse it).
            InputUnavailable: the other workflow or task is gone, or it did not COMPLETE; the
                task's input then fails with exit code 2010 and the reason in its log.
        """
        wid, _, task = ref.rpartition(":")
        if not wid or wid == current_wid:
            state = self.state(current_wid)
            if task not in state.tasks:
                raise NotFoundError(f"workflow {current_wid} has no task {task!r}")
            return self.run_dir(current_wid, task, state.tasks[task].retry_id) / "output"
        try:
            state = self.state(wid)
        except NotFoundError:
            raise InputUnavailable(f"no workflow {wid}") from None
        found = next((t for t in state.tasks.values() if name_key(t.name) == name_key(task)), None)
        if found is None:
            raise InputUnavailable(f"workflow {wid} has no task {task}")
        if found.status is not Status.COMPLETED:
            raise InputUnavailable(f"task {found.name} of workflow {wid} is "
                                   f"{found.status.value}, not COMPLETED")
        return self.run_dir(wid, found.name, found.retry_id) / "output"

    # ------------------------------------------------------------------ plumbing

    def _track(self, wid: str, live: _Live) -> None:
        self._live[wid] = live
        self._pool_name[wid] = live.pool

    def _pool_of(self, wid: str) -> Pool:
        return self.pools[self._pool_name[wid]]

    def _scheduler_of(self, wid: str) -> Scheduler:
        pool = self._pool_of(wid)
        if pool.name not in self._schedulers:
            self._schedulers[pool.name] = Scheduler(pool)
        return self._schedulers[pool.name]

    def _backend_of(self, wid: str) -> Backend[Any]:
        return self._pool_backend(self._pool_name[wid])

    def _pool_backend(self, pool: str) -> Backend[Any]:
        if pool not in self._backends:
            backend = self._backend_factory(self.pools[pool], self.home)
            backend.notify_facts(self.wake)  # facts as they happen, where it can
            self._backends[pool] = backend
        return self._backends[pool]

    def _poll(self) -> list[TaskFact]:
        facts: list[TaskFact] = []
        for backend in list(self._backends.values()):
            facts += backend.poll()
        return facts

    def _resume(self) -> None:
        """Drive the store's unfinished workflows again (module docstring), oldest first."""
        queued: list[tuple[float, int, int, str, str]] = []
        records = list(reversed(self.store.list_workflows(active_only=True)))  # seq ascending
        for order, record in enumerate(records):
            if record.pool not in self.pools:
                log.error("workflow %s names unknown pool %s; left as is", record.id, record.pool)
                continue
            state = state_from_dict(record.state)
            self._track(record.id, _Live(state, self._spec_loader(record), record.pool,
                                         record.submitted_by, _rank_of(record.source)))
            if state.status is WorkflowStatus.PENDING:  # Submitted may never have been applied
                self._pending.setdefault(record.id, []).append(m.Submitted(time.time()))
            queued += [(g.scheduling_since_s or 0.0, order, index, record.id, g.name)
                       for index, g in enumerate(state.groups.values())
                       if g.status is Status.SCHEDULING]
            self._restore(record.id, state)
        for *_order, wid, group in sorted(queued):
            self._enqueue(wid, group)
        self._stop_leftovers(records)

    def _stop_leftovers(self, active: list[WorkflowRecord]) -> None:
        """Stop every attempt that the store holds as ended but the backend finds alive (the
        killed engine stored the end, then died before its stop reached the backend)."""
        ended = self.store.list_workflows(ended_since_s=time.time() - LEFTOVER_WINDOW_S)
        by_pool: dict[str, list[TaskKey]] = {}
        for record in [*active, *ended]:
            keys = _ended_attempts(record.id, state_from_dict(record.state))
            if keys and record.pool in self.pools:
                by_pool.setdefault(record.pool, []).extend(keys)
        for pool, keys in by_pool.items():
            backend = self._pool_backend(pool)
            alive = backend.recover(keys)
            if alive:
                log.warning("stopping %d attempt(s) that had ended but still ran: %s", len(alive),
                            ", ".join(f"{k.workflow_id}/{k.task}/{k.retry_id}" for k in alive))
                backend.stop(alive)
                self._stopping.update(alive)  # a retry of theirs waits until they ended

    def _restore(self, wid: str, state: m.WorkflowState) -> None:
        """Give a resumed workflow's running groups their placements back and sort their
        current attempts into started (``recover``) and never started (``_unstarted``)."""
        live = self._live[wid]
        scheduler = self._scheduler_of(wid)
        keys = []
        for group in state.groups.values():
            if group.status in (Status.INITIALIZING, Status.RUNNING):
                placements = _placements_of(state, group, self.pools[live.pool])
                scheduler.restore((wid, group.name), self._requests(live, group.name), placements)
                keys += [TaskKey(wid, t, state.tasks[t].retry_id) for t in group.tasks
                         if not state.tasks[t].status.is_terminal()]
        if not keys:
            return
        backend = self._backend_of(wid)
        fresh = _unstarted_keys(backend, keys)
        if len(fresh) < len(keys):
            backend.recover([k for k in keys if k not in fresh])
        self._unstarted += _unstarted_starts(state, fresh)

    def _start_unstarted(self) -> list[tuple[str, m.Event]]:
        """Make the starts ``_resume`` found stored but never made; returns the events of
        those the backend refused. A retry whose earlier attempts are still being stopped
        (``_stop_leftovers``) is held until they ended, as ``_carry_out_one`` holds one."""
        events = []
        todo, self._unstarted = self._unstarted, []
        for item in todo:
            live = self._live.get(item.workflow_id)
            keys = frozenset(k for k in item.keys if live and _still_to_start(live.state, k))
            waiting = self._earlier_stopping(item.workflow_id, item.action) if keys else set()
            if waiting:
                self._deferred.append(_Deferred(item.workflow_id, item.action, waiting,
                                                time.monotonic() + RETRY_START_WAIT_S, keys))
                continue
            event = self._start(item.workflow_id, item.action, only=keys) if keys else None
            if event is not None:
                events.append((item.workflow_id, event))
        return events


def _start_groups(gangs: list[tuple[int, Backend[Any], list[TaskLaunch]]],
                  ) -> list[BackendError | None]:
    """Start ``gangs`` (all of one backend), one ``start_group`` each: the backend answers
    each gang before the next is handed over, which paces the local launcher's runner threads
    (a batch of up to 32 tasks started at once made them contend: ``_start_many``). Returns
    each gang's error or None."""
    backend = gangs[0][1]
    errors: list[BackendError | None] = []
    for _index, _backend, launches in gangs:
        try:
            backend.start_group(launches)
            errors.append(None)
        except BackendError as exc:
            errors.append(exc)
    return errors


def _in_time_order(facts: list[TaskFact]) -> list[TaskFact]:
    """``facts`` in the order they happened (by ``time_s``; each attempt's own facts keep
    the order its backend reported them in, even if its clock stepped back).

    A backend reports one attempt after the other; after an engine restart one poll reads
    everything its runners left while it was down, so a lead's exit at 14 s could come
    before a worker's exit at 6 s and decide the group first (issue 12, H2): sorted, the
    rules see the exits in the order they would have seen them live.
    """
    latest: dict[TaskKey, float] = {}
    keyed = []
    for index, fact in enumerate(facts):
        latest[fact.key] = max(fact.time_s, latest.get(fact.key, fact.time_s))
        keyed.append((latest[fact.key], index, fact))
    return [fact for *_order, fact in sorted(keyed, key=lambda item: item[:2])]


FAILED_STEP_MAX_DELAY_S = 30.0
STEP_REST_RATIO = 1.0
"""The engine rests this many times a step's duration before the next (``_pause_after_step``)."""
"""The longest wait between two steps while every step fails (a damaged store, say)."""


def _step_delay_s(poll_interval_s: float, failures: int) -> float:
    """The wait before the next step: the poll interval, doubled per step failed in a row
    (up to ``FAILED_STEP_MAX_DELAY_S``), so a lasting failure cannot spin or flood the log."""
    if failures == 0:
        return poll_interval_s
    return min(poll_interval_s * 2.0 ** min(failures, 30), FAILED_STEP_MAX_DELAY_S)


def _log_failed_step(failures: int, exc: Exception) -> None:
    """The first failure with its traceback; then one line on the 2nd, 4th, 8th... in a row."""
    if failures == 1:
        log.exception("engine step failed; retrying")
    elif failures & (failures - 1) == 0:
        log.error("engine step failed %d times in a row (retrying every %.1f s at most): %s",
                  failures, FAILED_STEP_MAX_DELAY_S, exc)


def _backend_reason(backend: Backend[Any], wid: str, group: m.GroupState,
                    state: m.WorkflowState) -> str:
    """``task NAME: REASON`` of the first task of ``group`` whose attempt the backend says
    waits (``Backend.waiting_reason``), else ""."""
    for name in group.tasks:
        task = state.tasks[name]
        reason = backend.waiting_reason(TaskKey(wid, name, task.retry_id))
        if reason:
            return f"task {name}: {reason}"
    return ""


def _ended_attempts(wid: str, state: m.WorkflowState) -> list[TaskKey]:
    """Every attempt of ``state`` that has ended: earlier attempts of each task, and the
    current one once terminal (never one that never started: it has no node)."""
    keys = []
    for task in state.tasks.values():
        keys += [TaskKey(wid, task.name, a.retry_id) for a in task.history if a.node is not None]
        if task.status.is_terminal() and task.node is not None:
            keys.append(TaskKey(wid, task.name, task.retry_id))
    return keys


def _unstarted_keys(backend: Backend[Any], keys: list[TaskKey]) -> frozenset[TaskKey]:
    """The attempts ``backend`` surely never started (``Backend.unstarted``)."""
    return frozenset(backend.unstarted(keys))


def _unstarted_starts(state: m.WorkflowState, fresh: frozenset[TaskKey]) -> list[_Unstarted]:
    """One start per group that has never-started attempts (``fresh``), rebuilt from the
    stored state: the gang started with them is every current attempt of the group that
    has not reported yet (INITIALIZING, no start time), in group order; it re-runs in place
    if one of them is a RESTART of the attempt before."""
    by_group: dict[str, set[str]] = {}
    for key in fresh:
        by_group.setdefault(state.tasks[key.task].group, set()).add(key.task)
    starts = []
    for group, names in by_group.items():
        together = [state.tasks[t] for t in state.groups[group].tasks
                    if t in names or _not_reported(state.tasks[t])]
        action = m.StartTasks(group, tuple((t.name, t.retry_id) for t in together),
                              restart_in_place=any(_restarted_in_place(t) for t in together))
        starts.append(_Unstarted(state.id, action, frozenset(
            k for k in fresh if k.task in names)))
    return starts


def _still_to_start(state: m.WorkflowState, key: TaskKey) -> bool:
    """Whether ``key`` is still its task's current attempt, waiting to start (not cancelled
    or ended since the restart)."""
    task = state.tasks[key.task]
    return task.retry_id == key.retry_id and task.status is Status.INITIALIZING


def _not_reported(task: m.TaskState) -> bool:
    """Started (or to be started) but nothing heard from its runner yet."""
    return task.status is Status.INITIALIZING and task.start_time_s is None


def _restarted_in_place(task: m.TaskState) -> bool:
    """Whether the task's current attempt follows the attempt before it by exit action
    RESTART (re-run in place), as opposed to RESCHEDULE or a first start."""
    if not task.history or task.history[-1].status is not Status.RESCHEDULED:
        return False
    code = task.history[-1].exit_code
    return code is not None and rules.action_for(task, code) is ExitAction.RESTART


def _placements_of(state: m.WorkflowState, group: m.GroupState, pool: Pool) -> dict[str, Placement]:
    """Placements of a running group rebuilt from the stored task nodes and GPU slots."""
    out = {}
    for name in group.tasks:
        task = state.tasks[name]
        if task.node is not None:
            out[name] = Placement(task.node, task.gpu_slots)
    return out


def _default_backend(pool: Pool, home: Path) -> Backend[Any]:
    return backends.get_backend(pool, home)


def _spec_source(sub: Submission) -> dict[str, Any]:
    """What a stored workflow keeps to rebuild its spec: the arguments that parse its
    rendered text again (stored once, in the record's ``spec_text``), or the spec as JSON."""
    if sub.reparse is not None:
        return {"reparse": sub.reparse}
    return {"spec": sub.spec.model_dump(mode="json", by_alias=True)}


def _spec_from_source(record: WorkflowRecord) -> WorkflowSpec:
    if "spec" in record.source:
        return WorkflowSpec.model_validate(record.source["spec"])
    return reparse(record.spec_text, **record.source["reparse"]).workflow
