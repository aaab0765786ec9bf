"""``trainyard.spec.load`` end to end: every rule, with its field path, line and file, and
every problem of a spec reported at once."""

from __future__ import annotations

import pytest
from spec_support import dedent, only_problem, problems, strict_problems, workflow

from trainyard import spec


def test_a_minimal_spec_loads_with_osmos_defaults() -> None:
    doc = spec.load("workflow:\n  name: w\n  tasks:\n  - name: t\n    command: [echo, hi]\n")
    assert doc.version == 2
    assert doc.workflow.timeout.exec_timeout_s is None
    [group] = doc.workflow.groups
    assert (group.name, group.barrier, group.ignore_nonlead_status) == ("t", True, True)
    task = group.tasks[0]
    assert (task.lead, task.resource, task.args, task.privileged, task.host_network) == (
        True,
        "default",
        [],
        False,
        False,
    )
    assert doc.workflow.resource_of(task) == spec.ResourceSpec()


def test_problem_lines_have_file_line_path_and_advice() -> None:
    text = workflow("""
        tasks:
        - name: t
          command: [echo]
          exitActions:
            COMPLETE: 300
    """)
    problem = only_problem(text, spec_path="/specs/my spec.yaml")
    assert str(problem) == (
        "/specs/my spec.yaml:7: workflow.tasks[0].exitActions.COMPLETE: exit code 300 "
        "is out of range; exit codes are 0-255 (higher codes are reserved for trainyard)"
    )


def test_every_problem_is_reported_at_once_in_spec_order() -> None:
    text = workflow("""
        labels: {team: ""}
        timeout: {exec_timeout: 1h30m}
        resources:
          default: {cpu: lots}
        groups:
        - name: g
          tasks:
          - name: a
            command: []
            volumeMounts: ['/a:/b:/c']
          - name: b
            command: [echo]
            files: [{path: tmp/x, contents: hi}]
            exitActions: {FAIL: 1-2, COMPLETE: "2"}
    """)
    found = problems(text)
    assert [p.path for p in found] == [
        "workflow.labels.team",
        "workflow.timeout.exec_timeout",
        "workflow.resources.default.cpu",
        "workflow.groups[0].tasks[0].command",
        "workflow.groups[0].tasks[0].volumeMounts[0]",
        "workflow.groups[0].tasks[1].files[0].path",
        "workflow.groups[0].tasks[1].exitActions",
    ]
    assert [p.line for p in found] == sorted(p.line for p in found)
    assert all(p.line is not None and "; " in p.message for p in found)


def test_cross_checks_are_all_reported_at_once() -> None:
    text = workflow("""
        groups:
        - name: g
          tasks:
          - name: a
            lead: true
            command: [sh, -c, "ping {{host:nobody}}"]
            inputs: [{task: ghost}]
            resource: huge
          - name: A
            command: [echo]
        - name: G
          tasks:
          - name: c
            command: [cat, "{{input:3}}"]
    """)
    found = strict_problems(text)
    messages = "\n".join(map(str, found))
    assert len(found) == 6, messages
    for fragment in (
        "task name 'A' is already used by task 'a'",
        "group name 'G' is already used by group 'g'",
        "input task 'ghost' does not exist",
        "{{host:nobody}}: no task named 'nobody'; group 'g' has",
        "{{input:3}} refers to input 3 but the task has no inputs",
        "resource 'huge' is not defined",
    ):
        assert fragment in messages


# top level


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        (
            "workflow: {name: w, tasks: [{name: t, command: [x]}]}\nextra: 1\n",
            "extra",
            "unknown field 'extra'; valid fields here: version, workflow, default-values",
        ),
        (
            "version: 1\nworkflow: {name: w, tasks: [{name: t, command: [x]}]}\n",
            "version",
            "use version: 2",
        ),
        ("default-values: {}\n", "workflow", "required field 'workflow' is missing"),
        (
            "workflow: {name: w, tasks: [{name: t, command: [x]}], tasks_typo: 1}\n",
            "workflow.tasks_typo",
            "valid fields here: name, pool, labels, timeout, resources, groups, tasks",
        ),
        (
            "workflow: {name: w, tasks: [{name: t, command: [x], exit_actions: {}}]}\n",
            "workflow.tasks[0].exit_actions",
            "valid fields here: name, image, command, args, lead, environment, credentials, inputs, outputs, files, "
            "resource, volumeMounts, exitActions, checkpoint, privileged, hostNetwork",
        ),
    ],
)
def test_top_level_and_unknown_keys(text: str, path: str, reason: str) -> None:
    problem = only_problem(text)
    assert problem.path == path
    assert reason in problem.message


@pytest.mark.parametrize("text", ["", "# only a comment\n", "- a\n- b\n", "just text\n"])
def test_a_spec_that_is_not_a_mapping(text: str) -> None:
    assert "not a YAML mapping" in only_problem(text).message


def test_yaml_syntax_errors_have_their_line() -> None:
    problem = only_problem("workflow:\n  name: w\n  tasks: [\n")
    assert problem.message.startswith("not valid YAML:")
    assert problem.line is not None and problem.path == ""


def test_a_key_given_twice_is_accepted_with_the_last_value_as_in_osmo() -> None:
    text = "workflow:\n  name: a\n  name: b\n  tasks: [{name: t, command: [x]}]\n"
    doc = spec.load(text)
    assert doc.workflow.name == "b"
    assert [(w.path, w.line) for w in doc.warnings] == [("workflow.name", 3)]
    assert "lines 2 and 3" in doc.warnings[0].message


def test_anchors_and_merge_keys_work() -> None:
    text = dedent("""
        workflow:
          name: w
          tasks:
          - &base {name: a, command: [echo], environment: {A: "1"}}
          - <<: *base
            name: b
    """)
    doc = spec.load(text)
    assert [t.environment for t in doc.workflow.all_tasks()] == [{"A": "1"}, {"A": "1"}]


def test_alias_bombs_are_refused() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, "
        f"*a{i - 1}, *a{i - 1}, *a{i - 1}]"
        for i in range(1, 9)
    ]
    assert "aliases expand the spec too much" in only_problem("\n".join(lines) + "\n").message


@pytest.mark.parametrize(
    "text",
    [
        "a: " + "[" * 5000 + "]" * 5000 + "\n",
        "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n",
        "".join(" " * i + f"k{i}:\n" for i in range(1100)) + " " * 1100 + "v\n",
    ],
)
def test_absurd_nesting_is_refused_before_the_parser_sees_it(text: str) -> None:
    assert "levels deep; flatten it" in only_problem(text).message


# workflow


def test_tasks_and_groups_together_are_refused() -> None:
    text = workflow("""
        tasks: [{name: a, command: [x]}]
        groups: [{name: g, tasks: [{name: b, command: [x]}]}]
    """)
    problem = only_problem(text)
    assert (problem.path, problem.message) == (
        "workflow",
        "give tasks or groups, not both; move the tasks into groups",
    )


@pytest.mark.parametrize("name", ["bad name", "ünïcode", "-x", "x" * 64])
def test_workflow_task_and_group_names_follow_the_name_rule(name: str) -> None:
    text = workflow(
        f"""
        groups:
        - name: "{name}"
          tasks: [{{name: "{name}", command: [x]}}]
    """,
        name=f'"{name}"',
    )
    assert {p.path for p in problems(text)} == {
        "workflow.name",
        "workflow.groups[0].name",
        "workflow.groups[0].tasks[0].name",
    }


def test_names_in_tasks_form_are_reported_once_at_the_task() -> None:
    text = workflow("tasks: [{name: 'bad name', command: [x]}]\n")
    problem = only_problem(text)
    assert problem.path == "workflow.tasks[0].name" and "ASCII letters" in problem.message


@pytest.mark.parametrize(
    ("names", "kind"), [(("train", "TRAIN"), "task"), (("a-b", "a_b"), "task")]
)
def test_task_names_are_unique_ignoring_case_and_dash_underscore(
    names: tuple[str, str], kind: str
) -> None:
    text = workflow(
        f"tasks: [{{name: {names[0]}, command: [x]}}, {{name: {names[1]}, command: [x]}}]\n"
    )
    problem = only_problem(text)
    assert problem.path == "workflow.tasks[1].name"
    assert f"task name '{names[1]}' is already used by task '{names[0]}'" in problem.message


def test_labels_are_kept_and_checked() -> None:
    doc = spec.load(
        workflow("labels: {team: ml, example.com/tier: gold}\ntasks: [{name: t, command: [x]}]\n")
    )
    assert doc.workflow.labels == {"team": "ml", "example.com/tier": "gold"}
    many = ", ".join(f"k{i}: v" for i in range(17))
    problem = only_problem(workflow(f"labels: {{{many}}}\ntasks: [{{name: t, command: [x]}}]\n"))
    assert problem.path == "workflow.labels" and "at most 16" in problem.message


@pytest.mark.parametrize(
    ("labels", "path", "reason"),
    [
        (
            "{n: 3}",
            "workflow.labels.n",
            "must be a string, got a int; give a string, quoted if needed",
        ),
        ("{n: {a: b}}", "workflow.labels.n", "must be a string, got a dict"),
        ("{n: ''}", "workflow.labels.n", "must be non-empty"),
        ("{'bad key': x}", "workflow.labels['bad key']", "invalid label key"),
        ("[a]", "workflow.labels", "mapping"),
    ],
)
def test_bad_labels(labels: str, path: str, reason: str) -> None:
    problem = only_problem(workflow(f"labels: {labels}\ntasks: [{{name: t, command: [x]}}]\n"))
    assert problem.path == path and reason in problem.message


def test_label_overrides_win_and_are_checked() -> None:
    text = workflow("labels: {team: a}\ntasks: [{name: t, command: [x]}]\n")
    assert spec.load(text, labels={"team": "b", "x": "y"}).workflow.labels == {
        "team": "b",
        "x": "y",
    }
    assert "non-empty" in only_problem(text, labels={"team": ""}).message


def test_set_env_adds_environment_to_every_task() -> None:
    text = workflow(
        "tasks: [{name: a, command: [x], environment: {A: spec, B: keep}}, {name: b, command: [x]}]\n"
    )
    doc = spec.load(text, set_env={"A": "cli", "C": "{{output}}"})
    assert [t.environment for t in doc.workflow.all_tasks()] == [
        {"A": "cli", "B": "keep", "C": "{{output}}"},
        {"A": "cli", "C": "{{output}}"},
    ]
    assert "invalid environment variable name" in only_problem(text, set_env={"1X": "v"}).message


@pytest.mark.parametrize(
    ("timeout", "reason"),
    [
        ("{exec_timeout: 1h30m}", "one unit"),
        ("{queue_timeout: -5}", "negative"),
        ("{exec_timeout: 5x}", "one unit"),
        ("{run_timeout: 5m}", "unknown field 'run_timeout'"),
    ],
)
def test_bad_timeouts(timeout: str, reason: str) -> None:
    assert (
        reason
        in only_problem(
            workflow(f"timeout: {timeout}\ntasks: [{{name: t, command: [x]}}]\n")
        ).message
    )


# groups and leads


def test_a_group_without_a_lead_is_refused_at_the_group() -> None:
    text = workflow(
        "groups: [{name: g, tasks: [{name: a, command: [x]}, {name: b, command: [x]}]}]\n"
    )
    problem = only_problem(text)
    assert problem.path == "workflow.groups[0]"
    assert problem.message == "group 'g' has no lead task; mark exactly one task with lead: true"


def test_an_empty_group_is_refused() -> None:
    assert "has no tasks" in only_problem(workflow("groups: [{name: g, tasks: []}]\n")).message


# tasks


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("[]", "command is empty"),
        ("['']", "first element of command) is empty"),
        ("['  ', x]", "is empty"),
        ("echo", "expected a list, got 'echo'"),
        ("[[a]]", "expected a string, got a list"),
        ("[true]", "expected a string, got True; quote the value"),
    ],
)
def test_bad_commands(command: str, reason: str) -> None:
    problem = only_problem(workflow(f"tasks: [{{name: t, command: {command}}}]\n"))
    assert problem.path.startswith("workflow.tasks[0].command") and reason in problem.message


def test_huge_args_unicode_and_spaces_pass_intact() -> None:
    big = "y" * 1_000_000
    text = workflow(
        f"tasks: [{{name: t, command: ['/opt/my tools/run me'], args: ['naïve 🚂', '{big}']}}]\n"
    )
    task = spec.load(text).workflow.groups[0].tasks[0]
    assert task.command == ["/opt/my tools/run me"] and task.args == ["naïve 🚂", big]


def test_bad_environment_names_are_refused() -> None:
    problem = only_problem(workflow("tasks: [{name: t, command: [x], environment: {'A-B': 1}}]\n"))
    assert (
        problem.path == "workflow.tasks[0].environment.A-B"
        and "invalid environment variable name" in problem.message
    )


@pytest.mark.parametrize(
    ("inputs", "path", "reason"),
    [
        (
            "[{url: s3://b, task: a}]",
            "workflow.tasks[1].inputs[0]",
            "exactly one of task, url, dataset (got task and url)",
        ),
        ("[{url: not-a-url}]", "workflow.tasks[1].inputs[0].url", "invalid URL 'not-a-url'"),
        (
            "[{dataset: {name: d, regex: '('}}]",
            "workflow.tasks[1].inputs[0].dataset.regex",
            "invalid regex",
        ),
        ("[{task: a, regex: '[z-a]'}]", "workflow.tasks[1].inputs[0].regex", "invalid regex"),
    ],
)
def test_bad_inputs(inputs: str, path: str, reason: str) -> None:
    text = workflow(
        f"tasks: [{{name: a, command: [x]}}, {{name: b, command: [x], inputs: {inputs}}}]\n"
    )
    problem = only_problem(text)
    assert problem.path == path and reason in problem.message


def test_dataset_inputs_and_outputs_are_kept() -> None:
    text = workflow("""
        tasks:
        - name: t
          command: [x]
          inputs: [{dataset: {name: 'bucket/data:3', regex: '.*\\.txt$'}}]
          outputs: [{dataset: {name: out, path: models, regex: '.*'}}, {url: 's3://b/{{workflow_id}}/'}]
    """)
    task = spec.load(text).workflow.groups[0].tasks[0]
    assert task.inputs[0].dataset == spec.DatasetRef(name="bucket/data:3", regex=r".*\.txt$")
    assert task.outputs[0].dataset == spec.DatasetRef(name="out", path="models", regex=".*")
    assert task.outputs[1].url == "s3://b/{{workflow_id}}/"


def test_checkpoints_are_parsed() -> None:
    text = workflow(
        "tasks: [{name: t, command: [x], checkpoint: [{path: /ck, url: 's3://b/ck', frequency: 5m, regex: '.*pth'}]}]\n"
    )
    [ck] = spec.load(text).workflow.groups[0].tasks[0].checkpoint
    assert (ck.path, ck.url, ck.frequency_s, ck.regex) == ("/ck", "s3://b/ck", 300, ".*pth")
    bad = workflow(
        "tasks: [{name: t, command: [x], checkpoint: [{path: /ck, url: 's3://b', frequency: 1h5m}]}]\n"
    )
    assert only_problem(bad).path == "workflow.tasks[0].checkpoint[0].frequency"


def test_exit_actions_in_spec_form() -> None:
    text = workflow(
        "tasks: [{name: t, command: [x], exitActions: {COMPLETE: '0,1-10,16', RESCHEDULE: 3-, FAIL: 11}}]\n"
    )
    problem = only_problem(text)
    assert problem.path == "workflow.tasks[0].exitActions.RESCHEDULE"
    overlapping = workflow(
        "tasks: [{name: t, command: [x], exitActions: {COMPLETE: '0,1-10', FAIL: 10}}]\n"
    )
    assert "exit codes 10 are mapped by both COMPLETE and FAIL" in only_problem(overlapping).message
    unknown = workflow("tasks: [{name: t, command: [x], exitActions: {RETRY: 1}}]\n")
    assert only_problem(unknown).message == (
        "got 'RETRY'; expected one of 'COMPLETE', 'FAIL', 'RESCHEDULE' or 'RESTART'"
    )


# files


@pytest.mark.parametrize(
    ("files", "path", "reason"),
    [
        ("[{path: /trainyard/run.sh, contents: x}]", "workflow.tasks[0].files[0].path", "reserves"),
        ("[{path: run.sh, contents: x}]", "workflow.tasks[0].files[0].path", "must be absolute"),
        (
            "[{path: /a, contents: x}, {path: '/b/../a', contents: y}]",
            "workflow.tasks[0].files[1].path",
            "already written by files[0] of this task",
        ),
        ("[{path: /a}]", "workflow.tasks[0].files[0]", "give the file's contents or a localpath"),
    ],
)
def test_bad_files(files: str, path: str, reason: str) -> None:
    problem = only_problem(workflow(f"tasks: [{{name: t, command: [x], files: {files}}}]\n"))
    assert problem.path == path and reason in problem.message


def test_two_tasks_may_write_the_same_path() -> None:
    text = workflow(
        "tasks: [{name: a, command: [x], files: [{path: /tmp/run.sh, contents: a}]},"
        " {name: b, command: [x], files: [{path: /tmp/run.sh, contents: b}]}]\n"
    )
    assert len(spec.load(text).workflow.groups) == 2


# resources


def test_resource_references() -> None:
    ok = workflow("tasks: [{name: a, command: [x], resource: default}, {name: b, command: [x]}]\n")
    assert spec.load(ok).workflow.resources == {}
    bad = workflow(
        "resources: {small: {cpu: 1}}\ntasks: [{name: a, command: [x], resource: big}]\n"
    )
    problem = only_problem(bad)
    assert problem.path == "workflow.tasks[0].resource"
    assert problem.message == (
        "resource 'big' is not defined (defined: small); add it under "
        "workflow.resources or name a defined one"
    )


def test_a_null_resource_entry_is_an_empty_request() -> None:
    doc = spec.load(workflow("resources: {default: }\ntasks: [{name: a, command: [x]}]\n"))
    assert doc.workflow.resources["default"] == spec.ResourceSpec()
