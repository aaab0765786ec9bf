"""The pydantic models on their own: normalised forms, single-object rules, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from trainyard.spec import (
    ExitAction,
    GroupSpec,
    ResourceSpec,
    SpecDocument,
    TaskSpec,
    Timeout,
    WorkflowSpec,
)


def task(name: str = "t", **extra: object) -> dict[str, object]:
    return {"name": name, "command": ["echo"], **extra}


def test_top_level_tasks_become_one_group_each_led_by_the_task() -> None:
    wf = WorkflowSpec.model_validate({"name": "w", "tasks": [task("a"), task("b")]})
    assert [g.name for g in wf.groups] == ["a", "b"]
    assert all(g.tasks[0].lead and g.lead is g.tasks[0] for g in wf.groups)


def test_a_single_task_group_gets_its_lead_automatically() -> None:
    group = GroupSpec.model_validate({"name": "g", "tasks": [task(lead=False)]})
    assert group.lead.name == "t"


@pytest.mark.parametrize(
    ("leads", "reason"),
    [((False, False), "has no lead task"), ((True, True), "has 2 lead tasks \\(a, b\\)")],
)
def test_groups_need_exactly_one_lead(leads: tuple[bool, bool], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        GroupSpec.model_validate(
            {"name": "g", "tasks": [task("a", lead=leads[0]), task("b", lead=leads[1])]}
        )


def test_group_defaults_follow_osmo() -> None:
    group = GroupSpec.model_validate({"name": "g", "tasks": [task()]})
    assert group.barrier is True and group.ignore_nonlead_status is True


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"tasks": [task()], "groups": []}, "not both"),
        ({}, "has no tasks"),
        ({"tasks": []}, "has no tasks"),
    ],
)
def test_tasks_or_groups(body: dict[str, object], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        WorkflowSpec.model_validate({"name": "w", **body})


def test_exit_actions_normalise_to_code_sets() -> None:
    t = TaskSpec.model_validate(
        task(exitActions={"COMPLETE": "0,1-3", "RESCHEDULE": 9, "RESTART": "10-11"})
    )
    assert t.exit_actions == {
        ExitAction.COMPLETE: {0, 1, 2, 3},
        ExitAction.RESCHEDULE: {9},
        ExitAction.RESTART: {10, 11},
    }
    assert [t.action_for(c) for c in (0, 3, 9, 11, 4, 255)] == [
        "COMPLETE",
        "COMPLETE",
        "RESCHEDULE",
        "RESTART",
        "FAIL",
        "FAIL",
    ]


def test_default_exit_actions_are_osmos() -> None:
    t = TaskSpec.model_validate(task())
    assert t.action_for(0) is ExitAction.COMPLETE and t.action_for(1) is ExitAction.FAIL


def test_overlapping_exit_codes_are_refused_naming_both_actions() -> None:
    with pytest.raises(
        ValidationError, match="exit codes 5-6 are mapped by both COMPLETE and FAIL"
    ):
        TaskSpec.model_validate(task(exitActions={"COMPLETE": "1-6", "FAIL": "5-9"}))


def test_unknown_exit_action_is_refused() -> None:
    with pytest.raises(ValidationError, match="COMPLETE"):
        TaskSpec.model_validate(task(exitActions={"RETRY": 1}))


def test_resources_normalise_quantities() -> None:
    r = ResourceSpec.model_validate(
        {
            "cpu": "500m",
            "gpu": "2",
            "memory": "1.5Gi",
            "storage": 1000,
            "platform": "",
            "nodesExcluded": ["n1"],
        }
    )
    assert (r.cpu, r.gpu, r.memory_bytes, r.storage_bytes, r.platform) == (
        0.5,
        2,
        3 * 2**29,
        1000,
        None,
    )
    assert ResourceSpec.model_validate({"memory": "1.5"}).memory_bytes == 2


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("gpu", "1.5", "whole number"),
        ("cpu", "lots", "quantity"),
        ("memory", "1GB", "quantity"),
        ("storage", -1, "negative"),
        ("gpu", True, "quantity"),
    ],
)
def test_bad_resources(field: str, value: object, reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        ResourceSpec.model_validate({field: value})


def test_timeouts_hold_seconds() -> None:
    t = Timeout.model_validate({"exec_timeout": "2m", "queue_timeout": 3600})
    assert (t.exec_timeout_s, t.queue_timeout_s) == (120, 3600)
    with pytest.raises(ValidationError, match="one unit"):
        Timeout.model_validate({"exec_timeout": "1h30m"})
    with pytest.raises(ValidationError, match="positive"):
        Timeout.model_validate({"exec_timeout": 0})


def test_file_needs_contents_or_localpath() -> None:
    with pytest.raises(ValidationError, match="contents or a localpath"):
        TaskSpec.model_validate(task(files=[{"path": "/tmp/x"}]))


@pytest.mark.parametrize(
    "inputs",
    [[{}], [{"task": "a", "url": "s3://b"}], [{"url": "s3://b", "dataset": {"name": "d"}}]],
)
def test_inputs_need_exactly_one_kind(inputs: list[dict[str, object]]) -> None:
    with pytest.raises(ValidationError, match="exactly one of task, url, dataset"):
        TaskSpec.model_validate(task(inputs=inputs))


def test_outputs_take_url_or_dataset_only() -> None:
    with pytest.raises(ValidationError, match="Extra inputs"):
        TaskSpec.model_validate(task(outputs=[{"task": "a"}]))
    t = TaskSpec.model_validate(
        task(outputs=[{"dataset": {"name": "d", "path": "sub", "regex": ".*"}}])
    )
    assert t.outputs[0].dataset is not None and t.outputs[0].dataset.path == "sub"


def test_numbers_in_command_args_and_environment_become_strings() -> None:
    t = TaskSpec.model_validate(task(command=["sleep", 5], args=[1.5], environment={"PORT": 29400}))
    assert (t.command, t.args, t.environment) == (["sleep", "5"], ["1.5"], {"PORT": "29400"})


def test_nulls_in_optional_lists_mean_empty() -> None:
    t = TaskSpec.model_validate(task(args=None, environment=None, inputs=None, exitActions=None))
    assert (t.args, t.environment, t.inputs, t.exit_actions) == ([], {}, [], {})


def _document() -> SpecDocument:
    return SpecDocument.model_validate(
        {
            "version": 2,
            "workflow": {
                "name": "w",
                "labels": {"team": "ml"},
                "timeout": {"exec_timeout": "1h"},
                "resources": {
                    "default": {"cpu": 2, "memory": "1Gi"},
                    "big": {"gpu": 8, "platform": "dgx-h100"},
                },
                "groups": [
                    {
                        "name": "g",
                        "ignoreNonleadStatus": False,
                        "tasks": [
                            task(
                                "a",
                                lead=True,
                                resource="big",
                                exitActions={"RESCHEDULE": "3"},
                                files=[{"path": "/tmp/x", "contents": "hi", "localpath": "x.sh"}],
                                checkpoint=[
                                    {"path": "/ck", "url": "s3://b/ck", "frequency": "10s"}
                                ],
                                volumeMounts=["/data:/data"],
                                inputs=[{"url": "s3://b/in", "regex": ".*"}],
                            ),
                            task("b"),
                        ],
                    }
                ],
            },
            "default-values": {"n": 1},
        }
    )


@pytest.mark.parametrize("mode", ["python", "json"])
def test_a_dumped_document_validates_to_an_equal_document(mode: str) -> None:
    doc = _document()
    assert SpecDocument.model_validate(doc.model_dump(by_alias=True, mode=mode)) == doc


@given(
    st.dictionaries(
        st.sampled_from(list(ExitAction)),
        st.frozensets(st.integers(0, 255), min_size=1),
        max_size=4,
    )
)
def test_exit_action_maps_round_trip_when_disjoint(
    mapping: dict[ExitAction, frozenset[int]],
) -> None:
    seen: set[int] = set()
    disjoint = {}
    for action, codes in mapping.items():
        if codes - seen:
            disjoint[action] = frozenset(codes - seen)
            seen |= codes
    t = TaskSpec.model_validate(task(exitActions=disjoint))
    dumped = t.model_dump(by_alias=True, mode="json")["exitActions"]
    assert TaskSpec.model_validate(task(exitActions=dumped)).exit_actions == disjoint
