"""``inputs: - task: WORKFLOW_ID:TASK``: another workflow's task output (issue 6).

The shape is checked when the spec loads; the task is not looked up (that workflow is not
known to the spec layer) and adds no edge to the DAG: the engine resolves it when the task
starts, only if that task COMPLETED.
"""

from __future__ import annotations

import pytest
from spec_support import only_problem, workflow

from trainyard import spec
from trainyard.engine.plan import build_state, group_upstreams
from trainyard.spec.fields import split_task_ref

CONSUMER = workflow("""
    tasks:
    - {name: local, command: [x]}
    - name: read
      command: [sh, -c, 'cat {{input:0}}/a {{input:1}}/b']
      inputs: [{task: "producer-1:make"}, {task: local}]
""")


def test_another_workflows_task_is_accepted_and_adds_no_edge() -> None:
    doc = spec.load(CONSUMER)
    read = doc.workflow.groups[1].tasks[0]
    assert [i.task for i in read.inputs] == ["producer-1:make", "local"]
    assert group_upstreams(doc.workflow) == {"local": frozenset(), "read": frozenset({"local"})}
    state = build_state("consumer-1", doc.workflow, max_retries=0, now_s=0.0)
    assert state.groups["read"].upstream == frozenset({"local"})


def test_an_only_cross_workflow_input_leaves_the_group_free_to_start() -> None:
    doc = spec.load(workflow("tasks: [{name: r, command: [x], inputs: [{task: 'wf_2:Make'}]}]\n"))
    assert group_upstreams(doc.workflow) == {"r": frozenset()}


@pytest.mark.parametrize(
    ("ref", "reason"),
    [
        (":make", "has an empty or invalid workflow id ''"),
        ("producer-1:", "has an empty or invalid task name ''"),
        ("a:b:c", "has more than one ':'"),
        ("pro ducer-1:make", "has an empty or invalid workflow id 'pro ducer-1'"),
        ("-producer:make", "has an empty or invalid workflow id '-producer'"),
        ("producer-1:ma ke", "has an empty or invalid task name 'ma ke'"),
    ],
)
def test_a_malformed_cross_workflow_input_is_refused(ref: str, reason: str) -> None:
    problem = only_problem(
        workflow(f"tasks: [{{name: r, command: [x], inputs: [{{task: '{ref}'}}]}}]\n")
    )
    assert problem.path == "workflow.tasks[0].inputs[0].task"
    assert (
        reason in problem.message
        and "use WORKFLOW_ID:TASK such as producer-1:make" in problem.message
    )
    assert problem.line == 3


def test_a_plain_task_name_still_names_a_task_of_this_workflow() -> None:
    problem = only_problem(workflow("tasks: [{name: r, command: [x], inputs: [{task: nobody}]}]\n"))
    assert "input task 'nobody' does not exist" in problem.message


def test_split_task_ref() -> None:
    assert split_task_ref("make") == (None, "make")
    assert split_task_ref("producer-1:make") == ("producer-1", "make")
