"""The step loop: one ``step`` turns backend facts into events, events into new states
(through the pure state machine), places queued gangs, stores every changed state in one
transaction, and only then carries out the actions (write-ahead: a killed engine never runs a
task twice). ``run_forever`` steps when woken or every ``poll_interval_s``. Order and pacing:
docs/engine.md "The step".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from trainyard.backends.base import Backend, FactKind, TaskFact, TaskKey
from trainyard.backends.facts import ENDING as _ENDING
from trainyard.engine import machine as m
from trainyard.engine import rules
from trainyard.engine.core import EngineCore
from trainyard.engine.live import fact_to_event
from trainyard.engine.reasons import read_log_tail
from trainyard.engine.serialize import state_to_dict
from trainyard.runner.report import LOG
from trainyard.status import Status
from trainyard.store import WorkflowRecord

__all__ = [
    "FAILED_STEP_MAX_DELAY_S",
    "STEP_REST_RATIO",
    "Actions",
    "StepLoop",
    "UnstartedStarts",
    "WAIT_REASONS_INTERVAL_S",
]

log = logging.getLogger("trainyard.engine")

WAIT_REASONS_INTERVAL_S = 2.0
"""How often the scheduler's waiting reasons are read into the state (and stored when they
changed); a gang queued for less than this has none yet."""

FAILED_STEP_MAX_DELAY_S = 30.0
"""The longest wait between two steps while every step fails (a damaged store, say)."""

STEP_REST_RATIO = 1.0
"""The engine rests this many times a step's duration before the next (``_pause_after_step``)."""


class Actions(Protocol):
    """What the step loop needs of the action runner (``actions.ActionRunner``)."""

    def carry_out(self, actions: list[tuple[str, m.Action]]) -> dict[str, list[m.Event]]:
        """Carry out ``actions`` in order; returns the events they yield, by workflow."""

    def start_deferred(self) -> list[tuple[str, m.Event]]:
        """Make the held retry starts now due; returns the events of those refused."""

    def note_ended(self, keys: set[TaskKey]) -> None:
        """``keys`` ended in the step under way (their stops are done)."""


class UnstartedStarts(Protocol):
    """What the step loop needs of recovery (``recovery.Recovery``)."""

    def start_unstarted(self) -> list[tuple[str, m.Event]]:
        """Make the starts a killed engine stored but never made; returns refusals."""


class StepLoop:
    """Steps the engine of ``core``: ``step`` once, ``run_forever`` in a loop, ``wait`` for
    one workflow. It owns which states changed and the counter of stored changes."""

    def __init__(self, core: EngineCore, actions: Actions, unstarted: UnstartedStarts) -> None:
        self.core = core
        self.actions = actions
        self.unstarted = unstarted
        self._dirty: set[str] = set()  # workflows whose state changed since it was stored
        self._running_loop = False  # True while run_forever drives the steps
        self._changed = threading.Condition()
        self._changes = 0  # how many times _store_changed_states stored changed states
        self._reasons_due_s = 0.0  # time.monotonic() of the next _note_waiting

    def step(self) -> None:
        """One pass of the loop (see the module docstring)."""
        core = self.core
        with core.lock:
            events: dict[str, list[m.Event]] = {wid: [] for wid in core.live}
            for wid, pending in core.pending.items():
                events.setdefault(wid, []).extend(pending)
            core.pending.clear()
            facts = _in_time_order(core.poll())
            self.actions.note_ended({f.key for f in facts if f.kind in _ENDING})
            for fact in facts:
                if fact.key.workflow_id in events:
                    self._log_backend_reason(fact)
                    events[fact.key.workflow_id].append(self._event_of(fact))
            for wid, event in self.actions.start_deferred():
                events.setdefault(wid, []).append(event)
            now = time.time()
            for wid in events:
                events[wid].append(m.Tick(now))
            self.apply_until_settled(events)
            # After the facts: an attempt whose gang ended while no engine ran (a peer's exit
            # read just now) is not started at all.
            refused: dict[str, list[m.Event]] = {}
            for wid, event in self.unstarted.start_unstarted():
                refused.setdefault(wid, []).append(event)
            if refused:
                self.apply_until_settled(refused)

    def _event_of(self, fact: TaskFact) -> m.Event:
        """``fact`` as an event, with the attempt's log tail (``task.log`` in its run folder)
        when it failed; none for an attempt already ended in the state (stopped with its
        gang or cancelled: its exit changes nothing, and a cancel of thousands of tasks
        must not read thousands of logs)."""
        key = fact.key
        live = self.core.live.get(key.workflow_id)
        task = live.state.tasks.get(key.task) if live is not None else None
        if task is None or task.retry_id != key.retry_id or task.status.is_terminal():
            return fact_to_event(fact)
        path = self.core.run_dir(key.workflow_id, key.task, key.retry_id) / LOG
        return fact_to_event(fact, lambda: read_log_tail(path, key.task))

    def _log_backend_reason(self, fact: TaskFact) -> None:
        """Write why an attempt ended to its task log when the backend, not the runner, saw
        it end (LOST, START_ERROR: the runner could not write it), and only if the fact will
        end the current attempt (a stopped or stale one is not reported as failed)."""
        if fact.kind not in (FactKind.LOST, FactKind.START_ERROR) or not fact.message:
            return
        live = self.core.live.get(fact.key.workflow_id)
        task = live.state.tasks.get(fact.key.task) if live else None
        if task is None or task.retry_id != fact.key.retry_id or task.status.is_terminal():
            return
        self.core.task_log(
            fact.key,
            f"the {self.core.backend_of(fact.key.workflow_id).name} backend "
            f"reports the task {fact.kind.value}: {fact.message}",
        )

    def wait(self, workflow_id: str, timeout_s: float | None = None) -> WorkflowRecord:
        """Block until the workflow is finished (driven by ``run_forever`` in another thread,
        or by this call when none runs). Returns the stored record."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self.core.lock:
                if workflow_id not in self.core.live:
                    return self.core.store.get_workflow(workflow_id)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"workflow {workflow_id} still running after {timeout_s} s")
            if not self._running_loop:
                self.step()
            time.sleep(self.core.poll_interval_s)

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
                self.core.woken.clear()  # a wake-up from now on makes the next step
                started = time.monotonic()
                try:
                    self.step()
                    failures = 0
                except Exception as exc:  # noqa: BLE001 - the loop must survive one bad step
                    failures += 1
                    _log_failed_step(failures, exc)
                if failures == 0:
                    self._pause_after_step(stop, time.monotonic() - started)
                self._pause(
                    stop, _step_delay_s(self.core.poll_interval_s, failures), wakeable=failures == 0
                )
        finally:
            self._running_loop = False

    def _pause_after_step(self, stop: threading.Event, step_s: float) -> None:
        """After a step that took ``step_s``, wait as long again (at most the tick) before a
        wake-up may start the next one: under a stream of facts (hundreds of tasks ending a
        second) the wake-ups of that time become one step, and stepping takes at most about
        half a core, while a single fact still waits no more than one step's duration."""
        rest_s = min(step_s * STEP_REST_RATIO, self.core.poll_interval_s)
        if rest_s > 0:
            stop.wait(rest_s)

    def _pause(self, stop: threading.Event, delay_s: float, *, wakeable: bool) -> None:
        """Wait ``delay_s``, or less: until ``wake`` (when ``wakeable``) or ``stop``."""
        deadline = time.monotonic() + delay_s
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            slice_s = min(remaining, self.core.poll_interval_s)
            if wakeable:
                if self.core.woken.wait(slice_s):
                    return
            else:
                stop.wait(slice_s)

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

    def apply_until_settled(self, events: dict[str, list[m.Event]]) -> None:
        """Apply events and place gangs, store, act; again until nothing more happens (a
        RequestPlacement carried out is placed in the next round, not the next step).
        The caller holds ``core.lock``."""
        while True:
            actions = self._apply_events(events) + self._place_ready()
            self._store_changed_states()
            if not actions:
                return
            events = self.actions.carry_out(actions)

    def _apply_events(self, events: dict[str, list[m.Event]]) -> list[tuple[str, m.Action]]:
        """Apply each workflow's events in order; returns the actions they asked for."""
        actions: list[tuple[str, m.Action]] = []
        for wid, evs in events.items():
            for ev in evs:
                actions += self._apply_event(wid, ev)
        return actions

    def _apply_event(self, wid: str, event: m.Event) -> list[tuple[str, m.Action]]:
        """Feed one event to the state machine (``rules.transition``); a changed state is
        marked to be stored. Returns its actions; none for a workflow no longer driven."""
        live = self.core.live.get(wid)
        if live is None:
            return []
        new_state, actions = rules.transition(live.state, event)
        if new_state is not live.state:
            live.state = new_state
            self._dirty.add(wid)
        return [(wid, a) for a in actions]

    def _place_ready(self) -> list[tuple[str, m.Action]]:
        """Place the queued gangs that fit now (``GroupPlaced``); returns their actions."""
        actions: list[tuple[str, m.Action]] = []
        for scheduler in self.core.schedulers.values():
            for (wid, group), placements in scheduler.place_ready():
                nodes = {task: p.node for task, p in placements.items()}
                slots = {task: p.gpu_slots for task, p in placements.items()}
                actions += self._apply_event(wid, m.GroupPlaced(time.time(), group, nodes, slots))
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
        for scheduler in self.core.schedulers.values():
            if not scheduler.queued():
                continue
            for (wid, group), reason in scheduler.waiting_reasons().items():
                live = self.core.live.get(wid)
                state = live.state.groups.get(group) if live is not None else None
                if state is None or state.waiting_reason == reason:
                    continue
                since = state.scheduling_since_s
                if since is None or wall - since >= WAIT_REASONS_INTERVAL_S:
                    self._apply_event(wid, m.GroupWaiting(wall, group, reason))

    def _note_backend_waiting(self, wall_s: float) -> None:
        """Each placed gang none of whose tasks started gets its backend's words for why
        (``Backend.waiting_reason`` of its tasks: the first task that has some, named),
        or "" once there are none (``GroupWaiting``; stored only when it changed)."""
        for wid, live in list(self.core.live.items()):
            waiting = [
                g
                for g in live.state.groups.values()
                if g.status is Status.INITIALIZING
                and all(live.state.tasks[t].start_time_s is None for t in g.tasks)
            ]
            if not waiting:
                continue
            backend = self.core.backend_of(wid)
            for group in waiting:
                reason = _backend_reason(backend, wid, group, live.state)
                if reason != (group.waiting_reason or ""):
                    self._apply_event(wid, m.GroupWaiting(wall_s, group.name, reason))

    def _store_changed_states(self) -> None:
        """Save every changed state in one transaction, stop driving the finished ones, and
        wake ``wait_for_change``."""
        if not self._dirty:
            return
        updates = {}
        for wid in self._dirty:
            st = self.core.live[wid].state
            updates[wid] = (st.status.value, st.end_time_s, state_to_dict(st))
        self.core.store.save_states(updates)
        self._dirty.clear()
        for wid, (_status, end_time_s, _state) in updates.items():
            if end_time_s is not None:  # finished: no longer driven
                del self.core.live[wid]
        with self._changed:
            self._changes += 1
            self._changed.notify_all()


def _in_time_order(facts: list[TaskFact]) -> list[TaskFact]:
    """``facts`` in the order they happened (by ``time_s``; each attempt's own facts keep
    the order its backend reported them in, even if its clock stepped back).

    A backend reports one attempt after the other; after an engine restart one poll reads
    everything its runners left while it was down, so a lead's exit at 14 s could come
    before a worker's exit at 6 s and decide the group first: sorted, the
    rules see the exits in the order they would have seen them live.
    """
    latest: dict[TaskKey, float] = {}
    keyed = []
    for index, fact in enumerate(facts):
        latest[fact.key] = max(fact.time_s, latest.get(fact.key, fact.time_s))
        keyed.append((latest[fact.key], index, fact))
    return [fact for *_order, fact in sorted(keyed, key=lambda item: item[:2])]


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
        log.error(
            "engine step failed %d times in a row (retrying every %.1f s at most): %s",
            failures,
            FAILED_STEP_MAX_DELAY_S,
            exc,
        )


def _backend_reason(
    backend: Backend[Any], wid: str, group: m.GroupState, state: m.WorkflowState
) -> str:
    """``task NAME: REASON`` of the first task of ``group`` whose attempt the backend says
    waits (``Backend.waiting_reason``), else ""."""
    for name in group.tasks:
        task = state.tasks[name]
        reason = backend.waiting_reason(TaskKey(wid, name, task.retry_id))
        if reason:
            return f"task {name}: {reason}"
    return ""
