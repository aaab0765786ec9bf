"""Every error at once (issue 2): field errors do not hide the cross-check problems of the
well-formed parts, and the broken parts cause no problem of their own beyond their field
errors (``trainyard.spec.partial``)."""

from __future__ import annotations

import copy

import pytest
import yaml
from spec_support import strict_problems, workflow

from trainyard import spec
from trainyard.errors import NotFoundError
from trainyard.spec.partial import lenient_view
from trainyard.spec.problems import Layout


def _found(text: str, **options: object) -> dict[str, str]:
    """Path -> message of every problem or warning (one per path in these tests; a
    ``{{host:X}}`` naming no task is a warning, issue 25)."""
    found = strict_problems(text, **options)
    assert len({p.path for p in found}) == len(found), "\n".join(map(str, found))
    return {p.path: p.message for p in found}


def test_a_bad_field_hides_no_cross_check_problem() -> None:
    text = workflow("""
        timeout: {exec_timeout: 5x}
        tasks:
        - name: a
          command: [sh, -c, 'ping {{host:nobody}}']
          resource: missing
    """)
    found = strict_problems(text)
    assert [(p.path, p.line) for p in found] == [
        ("workflow.timeout.exec_timeout", 3),
        ("workflow.tasks[0].command[2]", 6),
        ("workflow.tasks[0].resource", 7),
    ]
    assert "invalid duration '5x'" in found[0].message
    assert "{{host:nobody}}: no task named 'nobody'; group 'a' has a" in found[1].message
    assert "resource 'missing' is not defined" in found[2].message


def test_broken_fields_of_a_task_leave_its_other_fields_checked() -> None:
    text = workflow("""
        groups:
        - name: g
          tasks:
          - {name: lead, lead: true, command: [x], args: ['{{host:ghost}}', {not: text}],
             exitActions: {COMPLETE: 999}, environment: {1BAD: x, PEER: '{{host:ghost2}}'}}
          - {name: w, command: 5, files: [{path: rel}, {path: /ok, contents: '{{input:0}}'}]}
    """)
    assert set(_found(text)) == {
        "workflow.groups[0].tasks[0].args[0]",  # {{host:ghost}}
        "workflow.groups[0].tasks[0].args[1]",  # not a string
        "workflow.groups[0].tasks[0].exitActions.COMPLETE",
        "workflow.groups[0].tasks[0].environment['1BAD']",
        "workflow.groups[0].tasks[0].environment.PEER",  # {{host:ghost2}}
        "workflow.groups[0].tasks[1].command",
        "workflow.groups[0].tasks[1].files[0].path",
        "workflow.groups[0].tasks[1].files[1].contents",  # {{input:0}}, its index kept
    }


def test_a_badly_named_task_is_still_found_by_its_references() -> None:
    text = workflow("""
        tasks:
        - {name: 'bad name', command: [x]}
        - {name: b, command: [x], inputs: [{task: 'bad name'}], resource: nowhere}
    """)
    assert set(_found(text)) == {"workflow.tasks[0].name", "workflow.tasks[1].resource"}


def test_a_task_that_is_not_a_mapping_may_be_what_its_group_names() -> None:
    text = workflow("""
        groups:
        - name: g1
          tasks:
          - {name: a, lead: true, command: [sh, -c, '{{host:server}}']}
          - just text
        - name: g2
          tasks: [{name: b, command: [sh, -c, '{{host:server}}'], inputs: [{task: server}]}]
    """)
    found = _found(text)
    assert set(found) == {"workflow.groups[0].tasks[1]", "workflow.groups[1].tasks[0].command[2]"}
    assert (
        "{{host:server}}: no task named 'server'; group 'g2' has b"
        in found["workflow.groups[1].tasks[0].command[2]"]
    )


def test_repaired_inputs_turn_off_only_that_tasks_input_tokens() -> None:
    text = workflow("""
        tasks:
        - {name: a, command: [x]}
        - name: b
          command: [sh, -c, 'cat {{input:1}} {{input:a}}; ping {{host:nobody}}']
          inputs: [{task: a, url: 's3://b/p'}, {dataset: {name: ''}}]
        - {name: c, command: [sh, -c, 'cat {{input:0}}'], inputs: 7}
        - {name: d, command: [sh, -c, 'cat {{input:0}}']}
    """)
    found = _found(text)
    assert set(found) == {
        "workflow.tasks[1].inputs[0]",  # both task and url
        "workflow.tasks[1].inputs[1].dataset.name",
        "workflow.tasks[1].command[2]",  # {{host:nobody}}
        "workflow.tasks[2].inputs",
        "workflow.tasks[3].command[2]",  # {{input:0}} of a task with no inputs: real
    }
    assert "host:nobody" in found["workflow.tasks[1].command[2]"]


def test_broken_resources_leave_references_and_other_fits_alone() -> None:
    entry = workflow("""
        resources:
          small: {cpu: lots}
          huge: {gpu: 64}
        tasks:
        - {name: a, command: [x], resource: small}
        - {name: b, command: [x], resource: huge}
    """)
    found = _found(entry)
    assert set(found) == {"workflow.resources.small.cpu", "workflow.resources.huge.gpu"}
    assert "asks for 64 GPUs" in found["workflow.resources.huge.gpu"]
    whole = workflow("resources: 5\ntasks: [{name: a, command: [x], resource: small}]\n")
    assert set(_found(whole)) == {"workflow.resources"}


def test_a_group_with_two_leads_keeps_its_tasks_checked() -> None:
    text = workflow("""
        groups:
        - name: g
          tasks:
          - {name: a, lead: true, command: [x]}
          - {name: b, lead: true, command: [sh, -c, '{{host:c}}']}
    """)
    found = _found(text)
    assert set(found) == {"workflow.groups[0]", "workflow.groups[0].tasks[1].command[2]"}


def test_a_cross_problem_is_not_reported_twice_nor_at_a_stand_in() -> None:
    text = workflow("""
        tasks:
        - {name: a, command: [x], volumeMounts: ['a:b:c', /data], files: [{path: /x, contents: 1}, {path: /x, contents: 2}]}
        - {name: a, command: [x]}
    """)
    found = _found(text)
    assert set(found) == {
        "workflow.tasks[0].volumeMounts[0]",
        "workflow.tasks[0].volumeMounts[1]",  # /data is not allowed on the local pool
        "workflow.tasks[0].files[1].path",  # written twice
        "workflow.tasks[1].name",  # used twice
    }
    assert "more than one ':'" in found["workflow.tasks[0].volumeMounts[0]"]


def test_an_unusable_workflow_gets_its_field_errors_only() -> None:
    both = workflow("tasks: [{name: a, command: [x]}]\ngroups: []\n")
    assert set(_found(both)) == {"workflow"}
    no_list = workflow("tasks: 5\n")
    assert set(_found(no_list)) == {"workflow.tasks"}


def test_an_unknown_pool_with_field_errors_reports_the_field_errors() -> None:
    def lookup(name: str | None) -> object:
        raise NotFoundError(f"no pool {name}")

    text = workflow(
        "pool: nowhere\ntimeout: {queue_timeout: -1}\ntasks: [{name: a, command: [sh, -c, '{{host:x}}']}]\n"
    )
    assert set(_found(text, pool=lookup)) == {
        "workflow.timeout.queue_timeout",
        "workflow.tasks[0].command[2]",
    }
    with pytest.raises(NotFoundError):
        spec.load(text.replace("-1", "5m"), pool=lookup)


def test_the_parsed_spec_is_left_unchanged() -> None:
    data = yaml.safe_load(
        workflow("""
        groups:
        - name: g
          tasks: [{name: a, lead: true, command: 5, args: [{x: 1}]}, 7]
    """)
    )
    before = copy.deepcopy(data)
    errors = [
        {"loc": ("workflow", "groups", 0, "tasks", 0, "command")},
        {"loc": ("workflow", "groups", 0, "tasks", 0, "args", 0)},
        {"loc": ("workflow", "groups", 0, "tasks", 1)},
    ]
    view = lenient_view(data, errors, Layout())  # type: ignore[arg-type]
    assert view is not None and data == before
    assert [t.name for t in view.doc.workflow.groups[0].tasks] == ["a", "<invalid name 1>"]
    assert ("workflow", "groups", 0, "tasks", 1) in view.stand_ins
