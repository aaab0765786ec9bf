"""engine/rules.py: one test per status rule (OSMO lifecycle, lead task, exit actions,
timeouts, cancel)."""

from __future__ import annotations

import copy

import pytest
from machine_support import fold, group, solo, submitted, task, workflow

from trainyard.engine import rules
from trainyard.engine.machine import (
    CancelRequested,
    Event,
    GroupPlaced,
    GroupStartFailed,
    ReleaseGroup,
    RequestPlacement,
    StartTasks,
    StopTasks,
    Submitted,
    TaskAttempt,
    TaskExited,
    TaskInitializing,
    TaskLost,
    TaskRunning,
    Tick,
    WorkflowFinished,
    WorkflowState,
)
from trainyard.engine.plan import build_state
from trainyard.engine.rules import IllegalTransition, check_move, transition
from trainyard.errors import NotFoundError
from trainyard.spec.models import ExitAction, WorkflowSpec
from trainyard.status import Status, WorkflowStatus

S = Status
W = WorkflowStatus
RESCHEDULE, RESTART, COMPLETE = ExitAction.RESCHEDULE, ExitAction.RESTART, ExitAction.COMPLETE


def _placed(state: WorkflowState, name: str, t: float = 2.0) -> GroupPlaced:
    nodes = {task: f"node-{i}" for i, task in enumerate(state.groups[name].tasks)}
    return GroupPlaced(time_s=t, group=name, nodes=nodes)


def _running(state: WorkflowState, name: str, t: float = 3.0) -> WorkflowState:
    """Group ``name`` placed at t=2 and all its tasks RUNNING at ``t``."""
    state = fold(state, _placed(state, name))[0]
    runs = [TaskRunning(time_s=t, task=n, retry_id=0) for n in state.groups[name].tasks]
    return fold(state, *runs)[0]


def _gang(ignore_nonlead: bool = True, **actions: object) -> WorkflowSpec:
    """Group ``train`` (lead ``master``, ``w1``, ``w2``) feeding group ``eval``."""
    acts = {ExitAction(k): v for k, v in actions.items()}
    train = group(
        "train",
        task("master", lead=True, actions=acts),  # type: ignore[arg-type]
        task("w1", actions=acts),  # type: ignore[arg-type]
        task("w2", actions=acts),  # type: ignore[arg-type]
        ignore_nonlead=ignore_nonlead,
    )
    return workflow(train, solo("eval", inputs=["master"]))


def _statuses(state: WorkflowState) -> dict[str, Status]:
    return {name: t.status for name, t in state.tasks.items()}


# --------------------------------------------------------------------------- submit, place


def test_submitted_schedules_groups_without_upstream_in_spec_order() -> None:
    spec = workflow(solo("a"), solo("b", inputs=["a"]), solo("c"))
    state = build_state("wf-1", spec, max_retries=3, now_s=0.0)
    state, actions = transition(state, Submitted(time_s=1.0))
    assert actions == [RequestPlacement("a"), RequestPlacement("c")]
    assert {g.name: g.status for g in state.groups.values()} == {
        "a": S.SCHEDULING,
        "b": S.WAITING,
        "c": S.SCHEDULING,
    }
    assert _statuses(state) == {"a": S.SCHEDULING, "b": S.WAITING, "c": S.SCHEDULING}
    assert state.groups["a"].scheduling_since_s == 1.0
    assert state.status is W.PENDING
    assert transition(state, Submitted(time_s=2.0)) == (state, [])


def test_group_placed_starts_every_task_of_the_gang_on_its_node() -> None:
    state = submitted(_gang())
    state, actions = transition(state, _placed(state, "train"))
    assert actions == [StartTasks("train", (("master", 0), ("w1", 0), ("w2", 0)))]
    assert [(t.status, t.node) for t in state.tasks.values()][:3] == [
        (S.INITIALIZING, "node-0"),
        (S.INITIALIZING, "node-1"),
        (S.INITIALIZING, "node-2"),
    ]
    assert state.groups["train"].status is S.INITIALIZING
    assert state.status is W.RUNNING


def test_group_placed_must_name_a_node_for_every_task() -> None:
    state = submitted(_gang())
    with pytest.raises(ValueError, match=r"\['w2'\]"):
        transition(state, GroupPlaced(time_s=2.0, group="train", nodes={"master": "n", "w1": "n"}))


def test_a_placement_for_a_group_that_already_ended_is_released() -> None:
    state = submitted(workflow(solo("a")))
    state = fold(state, CancelRequested(time_s=2.0))[0]
    assert transition(state, _placed(state, "a", t=3.0))[1] == [ReleaseGroup("a")]


def test_a_placement_for_a_group_not_scheduling_is_ignored() -> None:
    state = submitted(_gang())
    assert transition(state, _placed(state, "eval"))[1] == []  # eval is WAITING
    state = fold(state, _placed(state, "train"))[0]
    assert transition(state, _placed(state, "train", t=5.0)) == (state, [])


# --------------------------------------------------------------------------- start failures


@pytest.mark.parametrize(
    ("backend_error", "status", "code"),
    [(False, S.FAILED_START_ERROR, 3003), (True, S.FAILED_BACKEND_ERROR, 3001)],
)
def test_group_start_failed_fails_the_gang_and_its_downstream(
    backend_error: bool, status: Status, code: int
) -> None:
    state = submitted(_gang())
    state = fold(state, _placed(state, "train"))[0]
    state, actions = transition(
        state, GroupStartFailed(time_s=3.0, group="train", backend_error=backend_error)
    )
    assert actions == [
        StopTasks((("master", 0), ("w1", 0), ("w2", 0))),
        ReleaseGroup("train"),
        WorkflowFinished(W.FAILED),
    ]
    assert state.groups["train"].status is status
    assert all(type(t.exit_code) is int for t in state.tasks.values())  # not ExitCode
    assert [(t.status, t.exit_code) for t in state.tasks.values()] == [(status, code)] * 3 + [
        (S.FAILED_UPSTREAM, 3000)
    ]
    assert state.groups["eval"].status is S.FAILED_UPSTREAM


def test_a_retry_that_cannot_start_fails_the_running_group() -> None:
    state = _running(submitted(_gang(RESCHEDULE=[42])), "train")
    state = fold(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=42))[0]
    state, actions = transition(
        state, GroupStartFailed(time_s=6.0, group="train", backend_error=True)
    )
    assert actions[:2] == [
        StopTasks((("master", 0), ("w1", 1), ("w2", 0))),
        ReleaseGroup("train"),
    ]
    assert state.groups["train"].status is S.FAILED_BACKEND_ERROR
    assert state.tasks["w1"].history[0].status is S.RESCHEDULED


# --------------------------------------------------------------------------- running


def test_task_initializing_sets_the_start_time() -> None:
    state = submitted(_gang())
    state = fold(state, _placed(state, "train"))[0]
    state, actions = transition(state, TaskInitializing(time_s=2.5, task="w1", retry_id=0))
    assert actions == []
    assert (state.tasks["w1"].status, state.tasks["w1"].start_time_s) == (S.INITIALIZING, 2.5)


def test_first_running_task_makes_the_group_and_workflow_run() -> None:
    state = submitted(_gang())
    state = fold(state, _placed(state, "train"))[0]
    state, actions = transition(state, TaskRunning(time_s=4.0, task="w2", retry_id=0))
    assert actions == []
    assert (state.tasks["w2"].status, state.tasks["w2"].start_time_s) == (S.RUNNING, 4.0)
    train = state.groups["train"]
    assert (train.status, train.running_since_s) == (S.RUNNING, 4.0)
    state = fold(state, TaskRunning(time_s=6.0, task="master", retry_id=0))[0]
    assert state.groups["train"].running_since_s == 4.0
    assert state.status is W.RUNNING


# --------------------------------------------------------------------------- lead task


def test_lead_completion_stops_the_others_completes_the_group_and_schedules_downstream() -> None:
    state = _running(submitted(_gang()), "train")
    state, actions = transition(
        state, TaskExited(time_s=9.0, task="master", retry_id=0, exit_code=0)
    )
    assert actions == [
        StopTasks((("w1", 0), ("w2", 0)), "Lead task finished"),
        ReleaseGroup("train"),
        RequestPlacement("eval"),
    ]
    assert [(t.status, t.exit_code, t.end_time_s, t.failure_reason) for t in state.tasks.values()][
        :3
    ] == [
        (S.COMPLETED, 0, 9.0, None),
        (S.COMPLETED, None, 9.0, "Lead task finished"),
        (S.COMPLETED, None, 9.0, "Lead task finished"),
    ]  # OSMO's reason for the stopped tasks, in the store (issue 25)
    assert (state.groups["train"].status, state.groups["train"].end_time_s) == (S.COMPLETED, 9.0)
    assert state.groups["eval"].status is S.SCHEDULING
    assert state.status is W.WAITING


def test_lead_failure_fails_the_group_and_every_downstream_group() -> None:
    spec = workflow(solo("a"), solo("b", inputs=["a"]), solo("c", inputs=["b"]), solo("d"))
    state = _running(submitted(spec), "a")
    state, actions = transition(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=7))
    assert actions == [ReleaseGroup("a")]
    assert [(t.status, t.exit_code) for t in state.tasks.values()] == [
        (S.FAILED, 7),
        (S.FAILED_UPSTREAM, 3000),
        (S.FAILED_UPSTREAM, 3000),
        (S.SCHEDULING, None),
    ]
    assert state.status is W.WAITING  # d still queued
    state, actions = fold(
        state, _placed(state, "d"), TaskExited(time_s=6.0, task="d", retry_id=0, exit_code=0)
    )
    assert actions[-1] == WorkflowFinished(W.FAILED)


def test_lead_failure_gives_the_stopped_tasks_the_leads_result() -> None:
    state = _running(submitted(_gang()), "train")
    state = fold(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=0))[0]
    state, actions = transition(
        state, TaskExited(time_s=6.0, task="master", retry_id=0, exit_code=1)
    )
    assert actions[0] == StopTasks((("w2", 0),), "Lead task finished")
    assert [state.tasks[n].status for n in ("master", "w1", "w2")] == [
        S.FAILED,
        S.COMPLETED,
        S.FAILED,
    ]
    assert [state.tasks[n].failure_reason for n in ("master", "w1", "w2")] == [
        "the command exited with code 1",
        None,
        "Lead task finished",
    ]  # issue 28: never empty
    assert state.tasks["w2"].exit_code is None
    assert state.groups["train"].status is S.FAILED


def test_all_non_leads_complete_then_the_lead_decides() -> None:
    state = _running(submitted(_gang()), "train")
    state = fold(
        state,
        TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=0),
        TaskExited(time_s=5.0, task="w2", retry_id=0, exit_code=0),
    )[0]
    assert state.groups["train"].status is S.RUNNING
    state, actions = transition(
        state, TaskExited(time_s=6.0, task="master", retry_id=0, exit_code=0)
    )
    assert actions == [ReleaseGroup("train"), RequestPlacement("eval")]
    assert state.groups["train"].status is S.COMPLETED


# --------------------------------------------------------------------------- non-lead tasks


def test_non_lead_completion_lets_the_group_go_on() -> None:
    state = _running(submitted(_gang(ignore_nonlead=False)), "train")
    state, actions = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=0))
    assert actions == []
    assert (state.tasks["w1"].status, state.groups["train"].status) == (S.COMPLETED, S.RUNNING)


def test_non_lead_failure_is_ignored_with_ignore_nonlead_status_true() -> None:
    state = _running(submitted(_gang(ignore_nonlead=True)), "train")
    state, actions = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=2))
    assert actions == []
    assert (state.tasks["w1"].status, state.tasks["w1"].exit_code) == (S.FAILED, 2)
    assert state.groups["train"].status is S.RUNNING
    state = fold(state, TaskExited(time_s=6.0, task="master", retry_id=0, exit_code=0))[0]
    assert state.groups["train"].status is S.COMPLETED
    assert state.tasks["w1"].status is S.FAILED


def test_non_lead_failure_fails_the_group_with_ignore_nonlead_status_false() -> None:
    state = _running(submitted(_gang(ignore_nonlead=False)), "train")
    state, actions = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=2))
    assert actions == [
        StopTasks((("master", 0), ("w2", 0))),
        ReleaseGroup("train"),
        WorkflowFinished(W.FAILED),
    ]
    assert [state.tasks[n].status for n in ("master", "w1", "w2", "eval")] == [
        S.FAILED,
        S.FAILED,
        S.FAILED,
        S.FAILED_UPSTREAM,
    ]
    assert state.groups["train"].status is S.FAILED


# --------------------------------------------------------------------------- exit codes


def test_exit_actions_map_user_codes() -> None:
    spec = workflow(solo("a", actions={COMPLETE: [3]}))
    state = _running(submitted(spec), "a")
    state, actions = transition(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=3))
    assert (state.tasks["a"].status, state.tasks["a"].exit_code) == (S.COMPLETED, 3)
    assert actions[-1] == WorkflowFinished(W.COMPLETED)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (2024, S.FAILED),
        (2010, S.FAILED),
        (256, S.FAILED),
        (3004, S.FAILED_EVICTED),
        (3006, S.FAILED_PREEMPTED),
    ],
)
def test_service_exit_codes_fail_without_an_exit_action(code: int, status: Status) -> None:
    """A service code no exit action covers (the spec's cover only 0-255) is a FAIL with its
    own status."""
    state = _running(submitted(workflow(solo("a", actions={RESCHEDULE: range(256)}))), "a")
    state, actions = transition(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=code))
    assert (state.tasks["a"].status, state.tasks["a"].exit_code) == (status, code)
    assert state.groups["a"].status is status
    assert actions == [ReleaseGroup("a"), WorkflowFinished(W.FAILED)]


@pytest.mark.parametrize(
    ("code", "status"), [(3001, S.FAILED_BACKEND_ERROR), (3005, S.FAILED_START_TIMEOUT)]
)
def test_a_pools_default_exit_action_reschedules_a_service_code(code: int, status: Status) -> None:
    """Issue 26: OSMO applies exit actions to every exit code, the pool's
    ``default_exit_actions`` where the task has none (OSMO's ``UpdateGroup._apply_exit_action``),
    so a pool with ``RESCHEDULE: 3001,3005`` retries backend errors and start timeouts;
    past ``max_retries`` the attempt FAILs with the code's own status."""
    spec = workflow(solo("a", actions={ExitAction.FAIL: range(1, 256)}))
    state = build_state(
        "wf-1",
        spec,
        max_retries=1,
        now_s=0.0,
        default_exit_actions={RESCHEDULE: frozenset({3001, 3005}), COMPLETE: frozenset({7})},
    )
    assert state.tasks["a"].exit_actions[RESCHEDULE] == frozenset({3001, 3005})
    assert COMPLETE not in state.tasks["a"].exit_actions  # the task's own FAIL of 7 wins
    state = _running(fold(state, Submitted(time_s=1.0))[0], "a")
    state, actions = transition(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=code))
    assert state.tasks["a"].retry_id == 1 and state.tasks["a"].status is S.INITIALIZING
    assert state.tasks["a"].history[-1].status is S.RESCHEDULED
    assert state.tasks["a"].history[-1].exit_code == code
    assert actions == [StartTasks("a", (("a", 1),), restart_in_place=False)]
    state, _ = transition(state, TaskRunning(time_s=6.0, task="a", retry_id=1))
    state, actions = transition(state, TaskExited(time_s=7.0, task="a", retry_id=1, exit_code=code))
    assert (state.tasks["a"].status, state.tasks["a"].exit_code) == (status, code)
    assert actions[-1] == WorkflowFinished(W.FAILED)


def test_task_lost_is_a_backend_error_and_never_rescheduled() -> None:
    state = _running(submitted(_gang(ignore_nonlead=True, RESCHEDULE=range(256))), "train")
    state, actions = transition(state, TaskLost(time_s=5.0, task="w2", retry_id=0))
    assert actions == []
    assert (state.tasks["w2"].status, state.tasks["w2"].exit_code) == (S.FAILED_BACKEND_ERROR, 3001)
    state, actions = transition(state, TaskLost(time_s=6.0, task="master", retry_id=0))
    assert state.groups["train"].status is S.FAILED_BACKEND_ERROR
    assert state.tasks["w1"].status is S.FAILED_BACKEND_ERROR
    assert actions[-1] == WorkflowFinished(W.FAILED)


# --------------------------------------------------------------------------- retries


def test_reschedule_starts_a_new_attempt_on_the_same_node() -> None:
    state = _running(submitted(_gang(ignore_nonlead=True, RESCHEDULE=[42])), "train")
    state, actions = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=42))
    assert actions == [StartTasks("train", (("w1", 1),))]
    w1 = state.tasks["w1"]
    assert (w1.status, w1.retry_id, w1.retries_used, w1.node) == (S.INITIALIZING, 1, 1, "node-1")
    assert (w1.exit_code, w1.start_time_s, w1.end_time_s) == (None, None, None)
    assert w1.history == [
        TaskAttempt(0, S.RESCHEDULED, 42, "node-1", 3.0, 5.0, "the command exited with code 42")
    ]
    assert [state.tasks[n].status for n in ("master", "w2")] == [S.RUNNING, S.RUNNING]
    assert state.groups["train"].status is S.RUNNING


def test_reschedule_restarts_the_running_peers_with_ignore_nonlead_status_false() -> None:
    state = _running(submitted(_gang(ignore_nonlead=False, RESCHEDULE=[42])), "train")
    state = fold(state, TaskExited(time_s=4.0, task="w2", retry_id=0, exit_code=0))[0]
    state, actions = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=42))
    assert actions == [
        StopTasks((("master", 0),)),
        StartTasks("train", (("master", 1), ("w1", 1))),
    ]
    master = state.tasks["master"]
    assert (master.status, master.retry_id, master.retries_used) == (S.INITIALIZING, 1, 0)
    assert master.history == [TaskAttempt(0, S.RESCHEDULED, None, "node-0", 3.0, 5.0)]
    assert (state.tasks["w2"].status, state.tasks["w2"].retry_id) == (S.COMPLETED, 0)
    assert state.groups["train"].status is S.RUNNING


def test_restart_reruns_in_place_and_shares_the_retry_cap() -> None:
    spec = workflow(solo("a", actions={RESTART: [11], RESCHEDULE: [21]}))
    state = _running(submitted(spec, max_retries=2), "a")
    state, actions = transition(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=11))
    assert actions == [StartTasks("a", (("a", 1),), restart_in_place=True)]
    state, actions = fold(
        state,
        TaskExited(time_s=6.0, task="a", retry_id=1, exit_code=21),
        TaskExited(time_s=7.0, task="a", retry_id=2, exit_code=11),
    )
    assert actions[0] == StartTasks("a", (("a", 2),))
    a = state.tasks["a"]
    assert (a.status, a.exit_code, a.retries_used, len(a.history)) == (S.FAILED, 11, 2, 2)
    assert actions[-1] == WorkflowFinished(W.FAILED)


def test_no_retries_allowed_means_reschedule_is_a_fail() -> None:
    state = _running(submitted(workflow(solo("a", actions={RESCHEDULE: [9]})), max_retries=0), "a")
    state = fold(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=9))[0]
    assert (state.tasks["a"].status, state.tasks["a"].history) == (S.FAILED, [])


# --------------------------------------------------------------------------- timeouts


def test_queue_timeout_fails_a_group_scheduling_too_long() -> None:
    spec = workflow(solo("a"), solo("b", inputs=["a"]), queue_s=60.0)
    state = submitted(spec)  # a SCHEDULING since t=1
    assert transition(state, Tick(time_s=61.0))[1] == []
    state, actions = transition(state, Tick(time_s=61.5))
    assert actions == [ReleaseGroup("a"), WorkflowFinished(W.FAILED_QUEUE_TIMEOUT)]
    assert _statuses(state) == {"a": S.FAILED_QUEUE_TIMEOUT, "b": S.FAILED_UPSTREAM}
    assert state.end_time_s == 61.5


def test_queue_timeout_counts_while_a_placed_gang_waits_in_the_backends_queue() -> None:
    spec = workflow(group("g", task("m", lead=True), task("w")), queue_s=60.0)
    state = fold(submitted(spec), _placed(submitted(spec), "g"))[0]  # a Slurm job PENDING
    assert state.groups["g"].status is S.INITIALIZING
    state, actions = transition(state, Tick(time_s=61.5))
    assert actions == [
        StopTasks((("m", 0), ("w", 0))),
        ReleaseGroup("g"),
        WorkflowFinished(W.FAILED_QUEUE_TIMEOUT),
    ]
    assert {t.status for t in state.tasks.values()} == {S.FAILED_QUEUE_TIMEOUT}


def test_queue_timeout_stops_counting_once_a_runner_of_the_gang_started() -> None:
    spec = workflow(group("g", task("m", lead=True), task("w")), queue_s=60.0)
    state = fold(
        submitted(spec),
        _placed(submitted(spec), "g"),
        TaskInitializing(time_s=30.0, task="w", retry_id=0),
    )[0]
    assert transition(state, Tick(time_s=500.0))[1] == []
    assert state.groups["g"].status is S.INITIALIZING


def test_exec_timeout_counts_from_the_first_running_task_and_fails_that_group_only() -> None:
    spec = workflow(solo("a"), solo("b", inputs=["a"]), solo("c"), exec_s=100.0)
    state = _running(submitted(spec), "a", t=50.0)
    state = _running(state, "c", t=60.0)
    assert transition(state, Tick(time_s=150.0))[1] == []
    state, actions = transition(state, Tick(time_s=150.5))
    assert actions == [StopTasks((("a", 0),)), ReleaseGroup("a")]
    assert _statuses(state) == {"a": S.FAILED_EXEC_TIMEOUT, "b": S.FAILED_UPSTREAM, "c": S.RUNNING}
    assert state.tasks["a"].exit_code is None
    state, actions = fold(state, TaskExited(time_s=151.0, task="c", retry_id=0, exit_code=0))
    assert actions[-1] == WorkflowFinished(W.FAILED_EXEC_TIMEOUT)


# --------------------------------------------------------------------------- cancel


def test_cancel_fails_everything_unfinished_stops_and_releases() -> None:
    spec = workflow(
        group("train", task("master", lead=True), task("w1")),
        solo("eval", inputs=["master"]),
        solo("other"),
    )
    state = _running(submitted(spec), "train")
    state = fold(state, TaskExited(time_s=4.0, task="w1", retry_id=0, exit_code=0))[0]
    state, actions = transition(state, CancelRequested(time_s=5.0))
    assert actions == [
        StopTasks((("master", 0),)),
        ReleaseGroup("train"),
        ReleaseGroup("other"),  # asked for a placement, not placed yet
        WorkflowFinished(W.FAILED_CANCELED),
    ]
    assert _statuses(state) == {
        "master": S.FAILED_CANCELED,
        "w1": S.COMPLETED,
        "eval": S.FAILED_CANCELED,
        "other": S.FAILED_CANCELED,
    }
    assert state.cancel_requested and state.status is W.FAILED_CANCELED
    assert transition(state, CancelRequested(time_s=6.0)) == (state, [])


def test_cancel_before_submission_and_after_the_end() -> None:
    spec = workflow(solo("a"))
    fresh = build_state("wf-1", spec, max_retries=3, now_s=0.0)
    state, actions = transition(fresh, CancelRequested(time_s=1.0))
    assert actions == [WorkflowFinished(W.FAILED_CANCELED)]
    done = fold(
        _running(submitted(spec), "a"), TaskExited(time_s=4.0, task="a", retry_id=0, exit_code=0)
    )[0]
    assert done.status is W.COMPLETED
    assert transition(done, CancelRequested(time_s=5.0)) == (done, [])


# --------------------------------------------------------------------------- workflow status


def test_workflow_is_pending_then_running_then_waiting_between_groups() -> None:
    state = submitted(workflow(solo("a"), solo("b", inputs=["a"])))
    assert state.status is W.PENDING
    state = _running(state, "a")
    assert state.status is W.RUNNING
    state = fold(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=0))[0]
    assert state.status is W.WAITING
    state, actions = fold(
        state, _placed(state, "b", t=6.0), TaskExited(time_s=7.0, task="b", retry_id=0, exit_code=0)
    )
    assert state.status is W.COMPLETED and state.end_time_s == 7.0
    assert actions.count(WorkflowFinished(W.COMPLETED)) == 1


def test_exec_timeout_outranks_other_failures_in_the_workflow_status() -> None:
    spec = workflow(solo("a"), solo("b"), exec_s=10.0, queue_s=10.0)
    state = _running(submitted(spec), "a")
    state = fold(state, Tick(time_s=12.0), Tick(time_s=14.0))[0]
    assert state.groups["b"].status is S.FAILED_QUEUE_TIMEOUT
    assert state.groups["a"].status is S.FAILED_EXEC_TIMEOUT
    assert state.status is W.FAILED_EXEC_TIMEOUT


# --------------------------------------------------------------------------- stale events


@pytest.mark.parametrize(
    "event",
    [
        TaskRunning(time_s=9.0, task="w1", retry_id=0),  # duplicate
        TaskInitializing(time_s=9.0, task="w1", retry_id=0),  # late, already running
        TaskExited(time_s=9.0, task="w1", retry_id=1, exit_code=0),  # future retry id
        TaskLost(time_s=9.0, task="eval", retry_id=0),  # never started
        Submitted(time_s=9.0),
    ],
)
def test_stale_and_duplicate_events_change_nothing(event: Event) -> None:
    state = _running(submitted(_gang()), "train")
    assert transition(state, event) == (state, [])


def test_reports_about_an_old_attempt_or_a_finished_task_are_ignored() -> None:
    state = _running(submitted(_gang(RESCHEDULE=[42])), "train")
    state = fold(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=42))[0]
    for old in (
        TaskExited(time_s=6.0, task="w1", retry_id=0, exit_code=1),
        TaskRunning(time_s=6.0, task="w1", retry_id=0),
        TaskLost(time_s=6.0, task="w1", retry_id=0),
    ):
        assert transition(state, old) == (state, [])
    state = fold(state, TaskExited(time_s=7.0, task="w2", retry_id=0, exit_code=0))[0]
    assert transition(state, TaskExited(time_s=8.0, task="w2", retry_id=0, exit_code=1)) == (
        state,
        [],
    )


def test_events_after_the_workflow_finished_are_ignored() -> None:
    state = _running(submitted(workflow(solo("a"))), "a")
    state = fold(state, TaskExited(time_s=5.0, task="a", retry_id=0, exit_code=0))[0]
    for event in (
        Tick(time_s=1e9),
        TaskLost(time_s=6.0, task="a", retry_id=0),
        GroupStartFailed(time_s=6.0, group="a"),
    ):
        assert transition(state, event) == (state, [])


# --------------------------------------------------------------------------- contract


def test_an_event_that_changes_nothing_returns_the_same_state_object() -> None:
    state = _running(submitted(_gang()), "train")
    assert transition(state, Tick(time_s=9.0))[0] is state
    assert transition(state, TaskRunning(time_s=9.0, task="w1", retry_id=0))[0] is state
    assert transition(state, TaskRunning(time_s=9.0, task="w1", retry_id=0))[0] is state
    ended = fold(submitted(workflow(solo("a"))), CancelRequested(time_s=2.0))[0]
    new, actions = transition(ended, _placed(ended, "a", t=3.0))
    assert (new, actions) == (ended, [ReleaseGroup("a")]) and new is ended


def test_the_input_state_is_never_mutated() -> None:
    state = _running(submitted(_gang(ignore_nonlead=False, RESCHEDULE=[42])), "train")
    before = copy.deepcopy(state)
    new, _ = transition(state, TaskExited(time_s=5.0, task="w1", retry_id=0, exit_code=42))
    assert state == before and new != before
    new.tasks["w2"].history.append(TaskAttempt(9, S.RESCHEDULED, None, None, None, None))
    assert state == before


def test_unknown_names_and_event_types_are_refused() -> None:
    state = submitted(_gang())
    with pytest.raises(NotFoundError, match="nope"):
        transition(state, TaskRunning(time_s=2.0, task="nope", retry_id=0))
    with pytest.raises(NotFoundError, match="nope"):
        transition(state, GroupPlaced(time_s=2.0, group="nope", nodes={}))
    with pytest.raises(TypeError, match="Event"):
        transition(state, Event(time_s=2.0))


def test_check_move_raises_on_a_move_the_table_forbids() -> None:
    check_move("task", "a", S.RUNNING, S.COMPLETED, rules.TASK_TRANSITIONS)
    check_move("task", "a", S.COMPLETED, S.COMPLETED, rules.TASK_TRANSITIONS)
    with pytest.raises(IllegalTransition, match=r"'a': COMPLETED -> RUNNING .*terminal"):
        check_move("task", "a", S.COMPLETED, S.RUNNING, rules.TASK_TRANSITIONS)
    with pytest.raises(IllegalTransition, match="group 'g': WAITING -> RUNNING"):
        check_move("group", "g", S.WAITING, S.RUNNING, rules.GROUP_TRANSITIONS)


def test_tables_never_leave_a_terminal_status() -> None:
    for table in (rules.TASK_TRANSITIONS, rules.GROUP_TRANSITIONS, rules.WORKFLOW_TRANSITIONS):
        assert not any(status.is_terminal() for status in table)
    assert S.RESCHEDULED not in set().union(*rules.GROUP_TRANSITIONS.values())


# --------------------------------------------------------------------------- before the barrier


def test_a_nonlead_failing_before_the_barrier_released_ends_the_gang_at_once() -> None:
    """Issue 12, M1: ``ignoreNonleadStatus: true`` lets a worker fail once the gang runs, but
    one that fails before the barrier (input download, 2010) leaves its peers waiting for a
    task that never comes: the group fails with it, the others are stopped."""
    state = submitted(_gang())
    state = fold(state, _placed(state, "train"))[0]
    state, actions = transition(
        state, TaskExited(time_s=3.0, task="w1", retry_id=0, exit_code=2010)
    )
    assert state.groups["train"].status is S.FAILED
    assert (state.tasks["w1"].status, state.tasks["w1"].exit_code) == (S.FAILED, 2010)
    assert state.tasks["master"].status is S.FAILED and state.tasks["master"].exit_code is None
    assert StopTasks((("master", 0), ("w2", 0))) in actions
    assert state.groups["eval"].status is S.FAILED_UPSTREAM


def test_a_nonlead_failing_after_the_barrier_released_leaves_the_gang_running() -> None:
    state = _running(submitted(_gang()), "train")
    state, _actions = transition(state, TaskExited(time_s=4.0, task="w1", retry_id=0, exit_code=1))
    assert state.groups["train"].status is S.RUNNING
    assert state.tasks["w1"].status is S.FAILED


def test_a_gang_that_never_passed_its_barrier_is_retried_whole_by_a_pool_default() -> None:
    """Issue 26: a Kubernetes gang not all running within ``gang_timeout_s`` is deleted and
    each attempt exits 3005; with the pool's ``RESCHEDULE: 3005`` the whole gang starts again
    as one start (its peers would wait at a barrier for a task that never comes)."""
    spec = workflow(group("g", task("master", lead=True), task("worker")))
    state = build_state(
        "wf-1", spec, max_retries=2, now_s=0.0, default_exit_actions={RESCHEDULE: frozenset({3005})}
    )
    state = fold(state, Submitted(time_s=1.0))[0]
    state = fold(state, _placed(state, "g"))[0]
    state, actions = transition(
        state, TaskExited(time_s=5.0, task="worker", retry_id=0, exit_code=3005)
    )
    assert actions == [StopTasks((("master", 0),)), StartTasks("g", (("master", 1), ("worker", 1)))]
    assert state.groups["g"].status is S.INITIALIZING
    late, again = transition(
        state, TaskExited(time_s=5.1, task="master", retry_id=0, exit_code=3005)
    )
    assert again == [] and late.tasks["master"].retry_id == 1  # the old attempt's end: stale
    assert state.tasks["master"].retries_used == 0 and state.tasks["worker"].retries_used == 1
