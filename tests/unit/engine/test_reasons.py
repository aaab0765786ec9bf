"""Failure and waiting reasons as data (issue 28): what the state machine keeps for a failed
attempt, what the scheduler says about a gang it cannot place, and what ``engine.reasons``
makes of them for query, --wait and the dashboard."""

from __future__ import annotations

from pathlib import Path

from machine_support import fold, group, solo, submitted, task, workflow

from trainyard.engine import reasons
from trainyard.engine.machine import (
    GroupPlaced,
    GroupWaiting,
    TaskExited,
    TaskRunning,
    Tick,
    WorkflowState,
)
from trainyard.engine.scheduler import REASONS_FOR_FIRST, Request, Scheduler
from trainyard.engine.serialize import state_from_dict, state_to_dict
from trainyard.pools import NodeSpec, Pool
from trainyard.runner.report import RUNNER_TAG, format_line
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status


def _running(spec: WorkflowSpec) -> WorkflowState:
    """``spec`` submitted, its first group placed and every task of it RUNNING."""
    state = submitted(spec)
    first = next(iter(state.groups))
    state, _ = fold(state, GroupPlaced(2.0, first, {t: "n0" for t in state.groups[first].tasks}))
    for name in state.groups[first].tasks:
        state, _ = fold(state, TaskRunning(3.0, name, 0))
    return state


def test_a_failed_command_keeps_its_code_reason_and_log_tail_and_they_survive_the_store() -> None:
    state = _running(workflow(solo("train")))
    state, _ = fold(
        state, TaskExited(4.0, "train", 0, 1, "", log_tail=("loading", "oops: data missing"))
    )
    failure = reasons.failure_of(state)
    assert failure is not None
    assert failure["task"] == "train" and failure["exit_code"] == 1
    assert failure["reason"] == "the command exited with code 1"
    assert failure["log_tail"] == ["loading", "oops: data missing"]
    again = state_from_dict(state_to_dict(state))
    assert again == state
    assert reasons.failure_of(again) == failure


def test_the_runners_own_words_win_over_the_exit_code() -> None:
    state = _running(workflow(solo("train")))
    state, _ = fold(state, TaskExited(4.0, "train", 0, 2010, "input 0: no such dataset x"))
    assert reasons.failure_of(state)["reason"] == "input 0: no such dataset x"


def test_a_completed_workflow_and_a_running_one_have_no_failure() -> None:
    state = _running(workflow(solo("train")))
    assert reasons.failure_of(state) is None
    state, _ = fold(state, TaskExited(4.0, "train", 0, 0, "", log_tail=("should not be kept",)))
    assert state.status.value == "COMPLETED"
    assert reasons.failure_of(state) is None
    assert state.tasks["train"].log_tail == ()


def test_the_failure_names_the_task_that_failed_not_the_siblings_it_stopped() -> None:
    spec = workflow(group("g", task("lead", lead=True), task("worker"), ignore_nonlead=False))
    state = _running(spec)
    state, _ = fold(state, TaskExited(4.0, "worker", 0, 3, "", log_tail=("worker broke",)))
    failure = reasons.failure_of(state)
    assert failure["task"] == "worker" and failure["log_tail"] == ["worker broke"]
    assert state.tasks["lead"].status.is_failed()


def test_a_signal_exit_is_named() -> None:
    assert reasons.exit_reason(137) == "the command was killed by SIGKILL (exit code 137)"
    assert "downloading an input failed" in reasons.exit_reason(2010)


def test_an_exec_timeout_says_so() -> None:
    state = _running(workflow(solo("train"), exec_s=10))
    state, _ = fold(state, Tick(20.0))
    failure = reasons.failure_of(state)
    assert failure["status"] == "FAILED_EXEC_TIMEOUT"
    assert "exec_timeout (10 s)" in failure["reason"]


def test_a_waiting_group_names_its_upstream_and_a_scheduling_one_its_reason() -> None:
    state = submitted(workflow(solo("prep"), solo("train", inputs=["prep"])))
    waits = {w["group"]: w for w in reasons.waits_of(state)}
    assert waits["prep"]["reason"] == "waiting for the scheduler"
    assert waits["train"]["reason"] == "waits for group prep (SCHEDULING) to complete"
    why = "needs 4 GPUs on pool local: 0 of 32 free; held by gpu-hog-1"
    state, _ = fold(state, GroupWaiting(2.0, "prep", why))
    assert {w["group"]: w["reason"] for w in reasons.waits_of(state)}["prep"] == why
    same, _ = fold(state, GroupWaiting(3.0, "prep", why))
    assert same is state  # the same reason again: nothing to store
    state, _ = fold(state, GroupPlaced(4.0, "prep", {"prep": "n0"}))
    assert state.groups["prep"].waiting_reason is None
    assert [w["group"] for w in reasons.waits_of(state)] == ["train"]


def test_group_waiting_for_a_placed_group_is_ignored() -> None:
    state = _running(workflow(solo("train")))
    after, _ = fold(state, GroupWaiting(5.0, "train", "late"))
    assert after is state


def _gpu_pool(nodes: int = 4, gpu: int = 8) -> Pool:
    return Pool(name="local", nodes=[NodeSpec(name=f"n{i}", gpu=gpu) for i in range(nodes)])


def test_scheduler_says_what_a_gang_needs_what_is_free_who_holds_it_and_its_place() -> None:
    sched = Scheduler(_gpu_pool())
    sched.enqueue(("gpu-hog-1", "g"), {f"t{i}": Request(gpu=8) for i in range(4)})
    assert len(sched.place_ready()) == 1
    sched.enqueue(("gpu-hog-2", "g"), {"a": Request(gpu=2)})
    sched.enqueue(("mine-1", "g"), {"a": Request(gpu=4)})
    assert sched.place_ready() == []
    why = sched.waiting_reasons()
    assert why[("mine-1", "g")] == (
        "needs 4 GPUs on pool local: 0 of 32 free; held by "
        "gpu-hog-1; behind gpu-hog-2 (2nd in queue)"
    )
    assert why[("gpu-hog-2", "g")].startswith("needs 2 GPUs on pool local: 0 of 32 free")


def test_scheduler_says_when_enough_is_free_but_not_on_the_nodes_a_gang_needs() -> None:
    sched = Scheduler(_gpu_pool(nodes=2, gpu=8))
    sched.enqueue(("w1", "g"), {"a": Request(gpu=6)})
    sched.enqueue(("w2", "g"), {"a": Request(gpu=6)})
    assert len(sched.place_ready()) == 2
    sched.enqueue(("w3", "g"), {"a": Request(gpu=4)})  # 4 free in all, 2 per node
    assert sched.place_ready() == []
    assert "enough is free in all, but no set of nodes fits" in sched.waiting_reasons()[("w3", "g")]


def test_scheduler_details_only_the_head_of_a_long_queue() -> None:
    sched = Scheduler(_gpu_pool(nodes=1, gpu=1))
    sched.enqueue(("hog", "g"), {"a": Request(gpu=1)})
    sched.place_ready()
    for i in range(REASONS_FOR_FIRST + 2):
        sched.enqueue((f"w{i}", "g"), {"a": Request(gpu=1)})
    why = sched.waiting_reasons()
    last = why[(f"w{REASONS_FOR_FIRST + 1}", "g")]
    assert last == f"behind {REASONS_FOR_FIRST} or more gangs in the queue of pool local"


def test_log_tail_keeps_the_commands_last_lines_not_the_runners(tmp_path: Path) -> None:
    log = tmp_path / "task.log"
    lines = [format_line("train", f"line {i}") for i in range(30)]
    lines.append(format_line("train", "oops: data missing " + "x" * 500))
    lines.append(format_line(f"train][{RUNNER_TAG}", "exit code 1"))
    log.write_text("\n".join(lines) + "\n")
    tail = reasons.read_log_tail(log, "train")
    assert len(tail) == reasons.LOG_TAIL_LINES
    assert tail[-2] == "line 29"
    assert tail[-1].startswith("oops: data missing") and tail[-1].endswith("...")
    assert len(tail[-1]) == reasons.LOG_TAIL_LINE_CHARS
    assert reasons.read_log_tail(tmp_path / "none.log", "train") == ()


def test_a_new_waiting_reason_changes_the_long_poll_key() -> None:
    from trainyard.server.workflow_reads import progress_key

    state = submitted(workflow(solo("train")))
    before = progress_key(state)
    state, _ = fold(state, GroupWaiting(2.0, "train", "needs 4 GPUs on pool local: 0 of 32 free"))
    assert progress_key(state) != before


def test_a_placed_group_whose_backend_queue_holds_it_keeps_that_reason_until_it_runs() -> None:
    """Issue 28, Slurm: a gang placed on a Slurm pool is INITIALIZING while its job waits in
    Slurm's queue; the backend's reason (squeue %r) is its waiting reason, shown by query,
    --wait, json and the dashboard (``waits_of``), and cleared once a task runs."""
    state = submitted(workflow(solo("train")))
    state, _ = fold(state, GroupPlaced(2.0, "train", {"train": "n0"}))
    why = "Slurm job 7 is PENDING (Resources): it waits for resources (nodes, CPUs, GPUs, memory) to be free"
    state, _ = fold(state, GroupWaiting(3.0, "train", why))
    assert state.groups["train"].waiting_reason == why
    waits = reasons.waits_of(state)
    assert [(w["group"], w["status"], w["reason"]) for w in waits] == [
        ("train", "INITIALIZING", why)
    ]
    state, _ = fold(state, TaskRunning(4.0, "train", 0))
    assert state.groups["train"].waiting_reason is None and reasons.waits_of(state) == []


def test_a_placed_gang_the_clusters_scheduler_cannot_place_shows_its_words() -> None:
    """Issue 26: a Kubernetes pod Pending with PodScheduled=False/Unschedulable. The gang is
    INITIALIZING (trainyard placed it, the cluster did not); the scheduler's message is
    what query, --wait and the dashboard show, until a task of it starts."""
    state = submitted(workflow(group("g", task("master", lead=True), task("worker"))))
    state, _ = fold(state, GroupPlaced(2.0, "g", {"master": "n0", "worker": "n1"}))
    assert state.groups["g"].status is Status.INITIALIZING
    why = "task master: Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu"
    state, _ = fold(state, GroupWaiting(3.0, "g", why))
    assert reasons.waits_of(state) == [
        {
            "group": "g",
            "status": "INITIALIZING",
            "reason": why,
            "since_s": state.groups["g"].scheduling_since_s,
        }
    ]
    assert state_from_dict(state_to_dict(state)).groups["g"].waiting_reason == why
    cleared, _ = fold(state, GroupWaiting(4.0, "g", ""))
    assert reasons.waits_of(cleared) == []  # the cluster placed it: nothing to say
    state, _ = fold(state, TaskRunning(5.0, "master", 0))
    assert state.groups["g"].waiting_reason is None and reasons.waits_of(state) == []
