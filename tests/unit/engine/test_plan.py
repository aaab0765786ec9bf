"""engine/plan.py: the DAG of groups and the initial state."""

from __future__ import annotations

import pytest
from machine_support import group, solo, task, workflow

from trainyard.engine.plan import build_state, group_upstreams, topological_groups
from trainyard.errors import SpecError
from trainyard.spec.models import ExitAction, TaskInput
from trainyard.status import Status, WorkflowStatus


def test_task_inputs_make_edges_between_groups() -> None:
    spec = workflow(
        group("prep", task("a", lead=True), task("b")),
        group("train", task("m", lead=True, inputs=["b"]), task("w", inputs=["a", "m"])),
        solo("eval", inputs=["w", "a"]),
    )
    assert group_upstreams(spec) == {
        "prep": frozenset(),
        "train": frozenset({"prep"}),  # w's input m is in its own group: no self-edge
        "eval": frozenset({"train", "prep"}),
    }


def test_inputs_of_other_workflows_urls_and_datasets_add_no_edge() -> None:
    other = task("x", lead=True, inputs=["wf-41:train"])
    other.inputs.append(TaskInput(url="s3://bucket/data"))
    spec = workflow(solo("train"), group("x", other))
    assert group_upstreams(spec) == {"train": frozenset(), "x": frozenset()}


def test_unknown_input_task_is_a_spec_error_naming_the_field() -> None:
    spec = workflow(solo("a"), solo("b", inputs=["nope"]))
    with pytest.raises(SpecError) as info:
        group_upstreams(spec)
    [problem] = info.value.problems
    assert problem.path == "workflow.groups[1].tasks[0].inputs[0].task"
    assert "nope" in problem.message and "a, b" in problem.message


def test_topological_order_is_stable_and_cycles_are_refused() -> None:
    order = topological_groups(
        {"c": frozenset({"a"}), "a": frozenset(), "b": frozenset(), "d": frozenset({"c", "b"})}
    )
    assert order == ["a", "b", "c", "d"]
    with pytest.raises(SpecError, match="cycle"):
        topological_groups({"a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset()})


def test_build_state_refuses_a_cycle() -> None:
    spec = workflow(solo("a", inputs=["b"]), solo("b", inputs=["a"]))
    with pytest.raises(SpecError, match=r"\['a', 'b'\]"):
        build_state("wf-1", spec, max_retries=1, now_s=0.0)


def test_build_state_holds_groups_tasks_flags_and_timeouts() -> None:
    spec = workflow(
        group(
            "train",
            task("master", lead=True, actions={ExitAction.RESCHEDULE: [42, 43]}),
            task("worker"),
            ignore_nonlead=False,
        ),
        solo("eval", inputs=["master"]),
        exec_s=3600.0,
        queue_s=60.0,
    )
    state = build_state("wf-7", spec, max_retries=2, now_s=5.0)
    assert (state.id, state.status, state.submit_time_s) == ("wf-7", WorkflowStatus.PENDING, 5.0)
    assert (state.exec_timeout_s, state.queue_timeout_s, state.max_retries) == (3600.0, 60.0, 2)
    assert list(state.groups) == ["train", "eval"]
    train = state.groups["train"]
    assert (train.tasks, train.upstream, train.ignore_nonlead_status) == (
        ["master", "worker"],
        frozenset(),
        False,
    )
    assert state.groups["eval"].upstream == frozenset({"train"})
    master = state.tasks["master"]
    assert (master.group, master.lead, master.status, master.retry_id) == (
        "train",
        True,
        Status.PENDING,
        0,
    )
    assert master.exit_actions == {ExitAction.RESCHEDULE: frozenset({42, 43})}
    assert state.tasks["worker"].lead is False
