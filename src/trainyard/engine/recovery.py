"""Recovery after a restart: drive the store's unfinished workflows again and redo what the
killed engine had stored but maybe not yet done (requeue, readopt, start what it never
started, stop attempts that ended in the store but still run). Order and rules: docs/engine.md
"Recovery after a restart".
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from trainyard.backends.base import Backend, TaskKey
from trainyard.engine import machine as m
from trainyard.engine import rules
from trainyard.engine.core import EngineCore
from trainyard.engine.live import (
    LiveWorkflow,
    UnstartedStart,
    rank_of,
    still_to_start,
)
from trainyard.engine.scheduler import Placement
from trainyard.engine.serialize import state_from_dict
from trainyard.pools import Pool
from trainyard.spec.models import ExitAction
from trainyard.status import Status, WorkflowStatus
from trainyard.store import WorkflowRecord

__all__ = ["LEFTOVER_WINDOW_S", "Recovery", "Starter", "ended_attempts"]

log = logging.getLogger("trainyard.engine")

LEFTOVER_WINDOW_S = 7 * 24 * 3600.0
"""How far back a restarted engine looks for ended workflows whose attempts may still run."""


class Starter(Protocol):
    """What recovery needs of the action runner (``actions.ActionRunner``)."""

    def enqueue(self, wid: str, group: str) -> None:
        """Queue the gang ``group`` of ``wid`` for placement."""

    def start_when_ready(
        self, wid: str, action: m.StartTasks, only: frozenset[TaskKey] | None = None
    ) -> m.Event | None:
        """Start ``action`` (``only`` those keys), or hold it while earlier attempts stop."""

    def note_stopping(self, keys: list[TaskKey]) -> None:
        """Stops were sent for ``keys``; retries of theirs wait until they end."""


class Recovery:
    """Resumes the store's unfinished workflows into ``core`` (``resume``, called once by
    ``Engine``) and makes the starts the killed engine stored but never made
    (``start_unstarted``, called by each step)."""

    def __init__(self, core: EngineCore, starter: Starter) -> None:
        self.core = core
        self.starter = starter
        self._unstarted: list[UnstartedStart] = []  # found by resume, started by the next step

    def resume(self) -> None:
        """Drive the store's unfinished workflows again (module docstring), oldest first."""
        core = self.core
        queued: list[tuple[float, int, int, str, str]] = []
        records = list(reversed(core.store.list_workflows(active_only=True)))  # seq ascending
        for order, record in enumerate(records):
            if record.pool not in core.pools:
                log.error("workflow %s names unknown pool %s; left as is", record.id, record.pool)
                continue
            state = state_from_dict(record.state)
            core.track(
                record.id,
                LiveWorkflow(
                    state,
                    core.spec_loader(record),
                    record.pool,
                    record.submitted_by,
                    rank_of(record.source),
                ),
            )
            if state.status is WorkflowStatus.PENDING:  # Submitted may never have been applied
                core.post(record.id, m.Submitted(time.time()))
            queued += [
                (g.scheduling_since_s or 0.0, order, index, record.id, g.name)
                for index, g in enumerate(state.groups.values())
                if g.status is Status.SCHEDULING
            ]
            self._restore(record.id, state)
        for *_order, wid, group in sorted(queued):
            self.starter.enqueue(wid, group)
        self._stop_leftovers(records)

    def _stop_leftovers(self, active: list[WorkflowRecord]) -> None:
        """Stop every attempt that the store holds as ended but the backend finds alive (the
        killed engine stored the end, then died before its stop reached the backend)."""
        ended = self.core.store.list_workflows(ended_since_s=time.time() - LEFTOVER_WINDOW_S)
        alive = self.stop_alive([*active, *ended])
        if alive:
            log.warning(
                "stopping %d attempt(s) that had ended but still ran: %s",
                len(alive),
                ", ".join(f"{k.workflow_id}/{k.task}/{k.retry_id}" for k in alive),
            )
            self.starter.note_stopping(alive)  # a retry of theirs waits until they ended

    def stop_alive(self, records: list[WorkflowRecord]) -> list[TaskKey]:
        """Stop the ended attempts (``ended_attempts``) of ``records`` that their pool's
        backend still finds alive (``Backend.recover``). Returns those, pool by pool."""
        by_pool: dict[str, list[TaskKey]] = {}
        for record in records:
            keys = ended_attempts(record.id, state_from_dict(record.state))
            if keys and record.pool in self.core.pools:
                by_pool.setdefault(record.pool, []).extend(keys)
        alive: list[TaskKey] = []
        for pool, keys in by_pool.items():
            backend = self.core.pool_backend(pool)
            found = backend.recover(keys)
            if found:
                backend.stop(found)
                alive += found
        return alive

    def _restore(self, wid: str, state: m.WorkflowState) -> None:
        """Give a resumed workflow's running groups their placements back and sort their
        current attempts into started (``recover``) and never started (``_unstarted``)."""
        core = self.core
        live = core.live[wid]
        scheduler = core.scheduler_of(wid)
        keys = []
        for group in state.groups.values():
            if group.status in (Status.INITIALIZING, Status.RUNNING):
                placements = _placements_of(state, group, core.pools[live.pool])
                scheduler.restore((wid, group.name), core.requests(live, group.name), placements)
                keys += [
                    TaskKey(wid, t, state.tasks[t].retry_id)
                    for t in group.tasks
                    if not state.tasks[t].status.is_terminal()
                ]
        if not keys:
            return
        backend = core.backend_of(wid)
        fresh = _unstarted_keys(backend, keys)
        if len(fresh) < len(keys):
            backend.recover([k for k in keys if k not in fresh])
        self._unstarted += _unstarted_starts(state, fresh)

    def start_unstarted(self) -> list[tuple[str, m.Event]]:
        """Make the starts ``resume`` found stored but never made; returns the events of
        those the backend refused. A retry whose earlier attempts are still being stopped
        (``_stop_leftovers``) is held until they ended (``Starter.start_when_ready``)."""
        events = []
        todo, self._unstarted = self._unstarted, []
        for item in todo:
            live = self.core.live.get(item.workflow_id)
            keys = frozenset(k for k in item.keys if live and still_to_start(live.state, k))
            if not keys:
                continue
            event = self.starter.start_when_ready(item.workflow_id, item.action, only=keys)
            if event is not None:
                events.append((item.workflow_id, event))
        return events


def ended_attempts(wid: str, state: m.WorkflowState) -> list[TaskKey]:
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


def _unstarted_starts(state: m.WorkflowState, fresh: frozenset[TaskKey]) -> list[UnstartedStart]:
    """One start per group that has never-started attempts (``fresh``), rebuilt from the
    stored state: the gang started with them is every current attempt of the group that
    has not reported yet (INITIALIZING, no start time), in group order; it re-runs in place
    if one of them is a RESTART of the attempt before."""
    by_group: dict[str, set[str]] = {}
    for key in fresh:
        by_group.setdefault(state.tasks[key.task].group, set()).add(key.task)
    starts = []
    for group, names in by_group.items():
        together = [
            state.tasks[t]
            for t in state.groups[group].tasks
            if t in names or _not_reported(state.tasks[t])
        ]
        action = m.StartTasks(
            group,
            tuple((t.name, t.retry_id) for t in together),
            restart_in_place=any(_restarted_in_place(t) for t in together),
        )
        starts.append(
            UnstartedStart(state.id, action, frozenset(k for k in fresh if k.task in names))
        )
    return starts


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
