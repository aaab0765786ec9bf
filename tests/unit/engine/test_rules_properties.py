"""Property tests of the state machine: random specs, random orders of valid, stale and
duplicate events, then a drain that lets every started task exit.

Checked after every event: the input state is not mutated; statuses move only along the
allowed tables; terminal groups and tasks never change; retries stay within max_retries;
WorkflowFinished comes at most once, exactly when the workflow ends; every StartTasks is for
a placed group and current retry ids; every StopTasks is for a started, current attempt, and
none twice. After the drain the workflow is terminal and so is everything in it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from machine_support import group, task, workflow

from trainyard.engine.machine import (
    Action,
    CancelRequested,
    Event,
    GroupPlaced,
    GroupStartFailed,
    RequestPlacement,
    StartTasks,
    StopTasks,
    Submitted,
    TaskExited,
    TaskInitializing,
    TaskLost,
    TaskRunning,
    TaskState,
    Tick,
    WorkflowFinished,
    WorkflowState,
)
from trainyard.engine.plan import build_state
from trainyard.engine.rules import (
    GROUP_TRANSITIONS,
    TASK_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    check_move,
    transition,
)
from trainyard.spec.models import ExitAction, GroupSpec, WorkflowSpec
from trainyard.status import Status

S = Status
STARTED = (S.INITIALIZING, S.RUNNING)
CODES = [0, 0, 1, 2, 3, 3, 2024, 3001, 3004]
#: Event kinds with their weights (cancel and start failures rare, so runs get far).
KINDS = (
    ["placed"] * 8
    + ["init"] * 4
    + ["running"] * 12
    + ["exited"] * 12
    + ["tick"] * 10
    + ["lost", "start_failed", "submitted", "submitted"]
)

# --------------------------------------------------------------------------- strategies

_A = ExitAction
#: Per task: the action of exit codes 0-3 (None: OSMO's default), so retries are common.
_code_actions = st.fixed_dictionaries(
    {0: st.sampled_from([None, None, None, _A.RESCHEDULE, _A.FAIL])}
    | {c: st.sampled_from([None, _A.RESCHEDULE, _A.RESTART, _A.COMPLETE]) for c in (1, 2, 3)}
)


def _by_action(code_actions: dict[int, ExitAction | None]) -> dict[ExitAction, list[int]]:
    """``exitActions`` (action -> codes) from a code -> action map: each code one action."""
    by_action: dict[ExitAction, list[int]] = {}
    for code, action in code_actions.items():
        if action is not None:
            by_action.setdefault(action, []).append(code)
    return by_action


@st.composite
def _group(draw: st.DrawFn, g: int) -> GroupSpec:
    """Group ``g<g>`` of 1-3 tasks; its first task reads the first task of earlier groups."""
    n_tasks = draw(st.integers(1, 3))
    lead = draw(st.integers(0, n_tasks - 1))
    upstream = draw(st.sets(st.integers(0, g - 1), max_size=2)) if g else set()
    tasks = [
        task(
            f"g{g}t{i}",
            lead=i == lead,
            inputs=[f"g{u}t0" for u in upstream] if i == 0 else [],
            actions=_by_action(draw(_code_actions)),
        )
        for i in range(n_tasks)
    ]
    return group(f"g{g}", *tasks, ignore_nonlead=draw(st.booleans()))


@st.composite
def specs(draw: st.DrawFn) -> tuple[WorkflowSpec, int]:
    """A DAG of 1-4 groups with random timeouts, and a max_retries of 0-2."""
    groups = [draw(_group(g)) for g in range(draw(st.integers(1, 4)))]
    exec_s = draw(st.sampled_from([None, 15.0, 40.0]))
    queue_s = draw(st.sampled_from([None, 15.0, 40.0]))
    return workflow(*groups, exec_s=exec_s, queue_s=queue_s), draw(st.integers(0, 2))


def _random_event(data: st.DataObject, state: WorkflowState, now: float) -> Event:
    """A random event about the current state; retry ids are sometimes stale or ahead."""
    kind = data.draw(st.sampled_from(KINDS))
    started = sorted(t.name for t in state.tasks.values() if t.status in STARTED)
    prefer_started = started and data.draw(st.sampled_from([True, True, True, False]))
    name = data.draw(st.sampled_from(started if prefer_started else sorted(state.tasks)))
    rid = state.tasks[name].retry_id + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    grp = data.draw(st.sampled_from(sorted(state.groups)))
    nodes = {t: f"n-{t}" for t in state.groups[grp].tasks}
    events: dict[str, Event] = {
        "placed": GroupPlaced(now, grp, nodes),
        "init": TaskInitializing(now, name, rid),
        "running": TaskRunning(now, name, rid),
        "exited": TaskExited(now, name, rid, data.draw(st.sampled_from(CODES))),
        "lost": TaskLost(now, name, rid),
        "tick": Tick(now),
        "start_failed": GroupStartFailed(now, grp, backend_error=data.draw(st.booleans())),
        "submitted": Submitted(now),
        "cancel": CancelRequested(now),
    }
    return events[kind]


def _drain_events(state: WorkflowState, now: float) -> list[Event]:
    """Place every queued gang, run every started task and let it exit with 0."""
    events: list[Event] = [
        GroupPlaced(now, g.name, {t: f"n-{t}" for t in g.tasks})
        for g in state.groups.values()
        if g.status is S.SCHEDULING
    ]
    for t in state.tasks.values():
        if t.status in STARTED:
            events += [TaskRunning(now, t.name, t.retry_id), TaskExited(now, t.name, t.retry_id, 0)]
    return events or [Submitted(now)]


# --------------------------------------------------------------------------- invariants


@dataclass
class Run:
    """One random run: the state so far and what the checks remember across events."""

    state: WorkflowState
    max_retries: int
    finished: int = 0
    stopped: set[tuple[str, int]] = field(default_factory=set)

    def apply(self, event: Event) -> None:
        before = copy.deepcopy(self.state)
        new, actions = transition(self.state, event)
        assert self.state == before, "the input state was mutated"
        _check_statuses(self.state, new, self.max_retries)
        self._check_actions(self.state, new, actions)
        _check_no_orphans(self.state, new, event, actions)
        _check_consistent(new)
        self.state = new

    def _check_actions(self, old: WorkflowState, new: WorkflowState, actions: list[Action]) -> None:
        ended = not old.status.is_terminal() and new.status.is_terminal()
        finished = [a for a in actions if isinstance(a, WorkflowFinished)]
        assert finished == ([WorkflowFinished(new.status)] if ended else [])
        self.finished += len(finished)
        assert self.finished <= 1
        for action in actions:
            _check_action(old, new, action)
            if isinstance(action, StopTasks):
                assert not self.stopped & set(action.tasks), "an attempt was stopped twice"
                self.stopped |= set(action.tasks)


def _check_task(old: TaskState, new: TaskState, max_retries: int) -> None:
    if old.status.is_terminal():
        assert new == old, f"terminal task {old.name} changed"
    elif new.retry_id == old.retry_id:
        check_move("task", old.name, old.status, new.status, TASK_TRANSITIONS)
        assert new.history == old.history
    else:
        assert new.retry_id == old.retry_id + 1 and old.status in STARTED
        check_move("task", old.name, old.status, S.RESCHEDULED, TASK_TRANSITIONS)
        assert new.history[:-1] == old.history and new.history[-1].retry_id == old.retry_id
        assert new.history[-1].status is S.RESCHEDULED and new.status is S.INITIALIZING
    assert old.retries_used <= new.retries_used <= max_retries


def _check_statuses(old: WorkflowState, new: WorkflowState, max_retries: int) -> None:
    check_move("workflow", old.id, old.status, new.status, WORKFLOW_TRANSITIONS)
    for name, g in old.groups.items():
        if g.status.is_terminal():
            assert new.groups[name] == g, f"terminal group {name} changed"
        check_move("group", name, g.status, new.groups[name].status, GROUP_TRANSITIONS)
    for name, t in old.tasks.items():
        _check_task(t, new.tasks[name], max_retries)


def _check_action(old: WorkflowState, new: WorkflowState, action: Action) -> None:
    if isinstance(action, StartTasks):
        g = new.groups[action.group]
        assert g.status in STARTED and action.tasks
        for name, rid in action.tasks:
            t = new.tasks[name]
            assert name in g.tasks and t.retry_id == rid and t.node is not None
            assert t.status is S.INITIALIZING
    elif isinstance(action, StopTasks):
        for name, rid in action.tasks:
            assert old.tasks[name].retry_id == rid and old.tasks[name].status in STARTED
    elif isinstance(action, RequestPlacement):
        assert new.groups[action.group].status is S.SCHEDULING
        assert old.groups[action.group].status is not S.SCHEDULING


def _check_no_orphans(
    old: WorkflowState, new: WorkflowState, event: Event, actions: list[Action]
) -> None:
    """A started attempt that ends or is replaced, other than by its own exit or loss, is
    stopped in the same transition: no process is left behind."""
    stopped = {a for action in actions if isinstance(action, StopTasks) for a in action.tasks}
    own = (event.task, event.retry_id) if isinstance(event, (TaskExited, TaskLost)) else None
    for name, t in old.tasks.items():
        after = new.tasks[name]
        gone = after.retry_id != t.retry_id or after.status.is_terminal()
        if t.status in STARTED and gone and (name, t.retry_id) != own:
            assert (name, t.retry_id) in stopped, f"attempt {name}/{t.retry_id} left running"


def _check_consistent(state: WorkflowState) -> None:
    """A terminal group holds only terminal tasks; a group left WAITING only after all its
    upstream groups COMPLETED, and is FAILED_UPSTREAM only after one of them failed; the
    workflow is terminal iff every group is."""
    for g in state.groups.values():
        if g.status.is_terminal():
            assert all(state.tasks[t].status.is_terminal() for t in g.tasks)
        ups = [state.groups[u].status for u in g.upstream]
        if g.status is S.FAILED_UPSTREAM:
            assert any(u.is_failed() for u in ups)
        elif g.status not in (S.PENDING, S.WAITING, S.FAILED_CANCELED):
            assert all(u is S.COMPLETED for u in ups)
    all_ended = all(g.status.is_terminal() for g in state.groups.values())
    assert state.status.is_terminal() == all_ended
    assert (state.end_time_s is not None) == state.status.is_terminal()


# --------------------------------------------------------------------------- properties


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_and_retries=specs(), data=st.data())
def test_any_event_order_keeps_the_invariants_and_ends_terminal(
    spec_and_retries: tuple[WorkflowSpec, int], data: st.DataObject
) -> None:
    spec, max_retries = spec_and_retries
    run = Run(build_state("wf-1", spec, max_retries=max_retries, now_s=0.0), max_retries)
    now = 0.0
    cancel_at = data.draw(st.integers(0, 150))  # cancel in about one run of five
    for step in range(data.draw(st.integers(0, 40))):
        now += data.draw(st.integers(0, 10))
        cancel = step == cancel_at
        run.apply(CancelRequested(now) if cancel else _random_event(data, run.state, now))
    for _ in range(100):
        if run.state.status.is_terminal():
            break
        now += 1.0
        for event in _drain_events(run.state, now):
            run.apply(event)
    assert run.state.status.is_terminal()
    assert all(t.status.is_terminal() for t in run.state.tasks.values())
    assert run.finished == 1
    note_event(f"workflow {run.state.status}")
    for g in run.state.groups.values():
        note_event(f"group {g.status}")
    note_event(f"retried: {any(t.history for t in run.state.tasks.values())}")


@settings(max_examples=100, deadline=None)
@given(spec_and_retries=specs(), data=st.data())
def test_replaying_every_event_twice_is_the_same_as_once(
    spec_and_retries: tuple[WorkflowSpec, int], data: st.DataObject
) -> None:
    """A duplicated event (a backend reporting a fact twice, a second tick at the same time)
    changes nothing the second time; only a placement for an ended group is handed back
    again each time."""
    spec, max_retries = spec_and_retries
    state = build_state("wf-1", spec, max_retries=max_retries, now_s=0.0)
    now = 0.0
    for step in range(data.draw(st.integers(0, 40))):
        now += data.draw(st.integers(0, 10))
        event = CancelRequested(now) if step == 30 else _random_event(data, state, now)
        state, _ = transition(state, event)
        again, actions = transition(state, event)
        if not isinstance(event, GroupPlaced):
            assert (again, actions) == (state, []) and again is state
