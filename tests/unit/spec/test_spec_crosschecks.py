"""Rules across parts of a spec: inputs and their order, special tokens, localpath files,
pool fit and mounts; lines of problems inside block scalars."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spec_support import dedent, only_problem, osmo_pool, strict_problems, workflow

from trainyard import spec
from trainyard.pools import NodeSpec, Pool


def _only(found: list) -> object:
    assert len(found) == 1, "\n".join(map(str, found))
    return found[0]


# inputs

SERIAL = workflow("""
    tasks:
    - {name: a, command: [x]}
    - {name: b, command: [x], inputs: [{task: a}]}
    - {name: c, command: [x], inputs: [{task: A}, {task: b}]}
""")


def test_inputs_from_earlier_tasks_are_fine_and_match_like_names() -> None:
    doc = spec.load(SERIAL)
    assert [i.task for i in doc.workflow.groups[2].tasks[0].inputs] == ["A", "b"]


@pytest.mark.parametrize(
    ("body", "path", "reason"),
    [
        (
            "tasks: [{name: a, command: [x], inputs: [{task: b}]}, {name: b, command: [x]}]",
            "workflow.tasks[0].inputs[0].task",
            "input task 'b' is in group 'b', defined after 'a'; move that group before this one",
        ),
        (
            "tasks: [{name: a, command: [x], inputs: [{task: a}]}]",
            "workflow.tasks[0].inputs[0].task",
            "is in this task's own group 'a'",
        ),
        (
            "tasks: [{name: a, command: [x], inputs: [{task: zz}]}]",
            "workflow.tasks[0].inputs[0].task",
            "input task 'zz' does not exist; name one of the tasks: a",
        ),
        (
            "groups: [{name: g, tasks: [{name: a, lead: true, command: [x]}, {name: b, command: [x], inputs: [{task: a}]}]}]",
            "workflow.groups[0].tasks[1].inputs[0].task",
            "own group 'g', whose tasks start together",
        ),
    ],
)
def test_bad_task_inputs(body: str, path: str, reason: str) -> None:
    problem = only_problem(workflow(body + "\n"))
    assert problem.path == path and reason in problem.message


def test_a_cycle_is_named_with_its_groups() -> None:
    text = workflow("""
        groups:
        - {name: g1, tasks: [{name: a, command: [x], inputs: [{task: c}]}]}
        - {name: g2, tasks: [{name: b, command: [x], inputs: [{task: a}]}]}
        - {name: g3, tasks: [{name: c, command: [x], inputs: [{task: b}]}]}
    """)
    problem = only_problem(text)
    assert problem.path == "workflow.groups[0].tasks[0].inputs[0].task"
    assert "makes a cycle of groups (g1 -> g3 -> g2 -> g1)" in problem.message


# tokens


def _tokens_spec(script: str, inputs: str = "[]") -> str:
    text = workflow(f"""
        groups:
        - name: first
          tasks: [{{name: prep, command: [x]}}]
        - name: train
          tasks:
          - name: master
            lead: true
            command: [sh]
            inputs: {inputs}
            files:
            - path: /tmp/run.sh
              contents: |
                set -e
                SCRIPT
          - {{name: worker_1, command: [x]}}
    """)
    indent = " " * 10
    return text.replace(f"{indent}SCRIPT", "\n".join(indent + line for line in script.splitlines()))


@pytest.mark.parametrize(
    "script",
    [
        "ping {{host:worker_1}} {{ host:Worker-1 }} {{host:master}}",
        "cat {{input:0}}/a {{input:prep}} {{ input:prep }} > {{output}}/b # {{workflow_id}}",
    ],
)
def test_good_tokens(script: str) -> None:
    assert spec.load(_tokens_spec(script, "[{task: prep}]"))


@pytest.mark.parametrize(
    ("script", "reason"),
    [
        (
            "ping {{host:prep}}",
            "{{host:prep}}: task 'prep' is in group 'first', not in group 'train' (tasks: master, worker_1)",
        ),
        ("cat {{input:1}}", "{{input:1}} refers to input 1 but the task has 1 inputs (0-0)"),
        (
            "cat {{ input:worker_1 }}",
            "{{ input:worker_1 }} names no task input of this task; add '- task: worker_1'",
        ),
    ],
)
def test_bad_tokens_point_at_their_line_in_the_file_contents(script: str, reason: str) -> None:
    text = _tokens_spec("echo one\n" + script, "[{task: prep}]")
    problem = _only(strict_problems(text))
    assert problem.path == "workflow.groups[1].tasks[0].files[0].contents"
    assert reason in problem.message
    assert text.splitlines()[problem.line - 1].strip() == script.strip()


def test_tokens_are_checked_in_command_args_and_environment() -> None:
    text = workflow("""
        tasks:
        - name: t
          command: [sh, "{{input:0}}"]
          args: ["{{host:x}}"]
          environment: {PEER: "{{host:y}}"}
    """)
    assert [p.path for p in strict_problems(text)] == [
        "workflow.tasks[0].command[1]",
        "workflow.tasks[0].args[0]",
        "workflow.tasks[0].environment.PEER",
    ]


def test_each_bad_token_is_reported_once_per_field() -> None:
    text = workflow("tasks: [{name: t, command: [sh, -c, '{{host:x}} {{host:x}} {{host:y}}']}]\n")
    assert len(strict_problems(text)) == 2


# localpath


def _localpath_spec(localpath: str) -> str:
    return workflow(
        f"tasks: [{{name: t, command: [x], files: [{{path: /tmp/f, localpath: '{localpath}'}}]}}]\n"
    )


def test_localpath_is_read_relative_to_the_spec(weird_tmp_path: Path) -> None:
    (weird_tmp_path / "sub dir").mkdir()
    (weird_tmp_path / "sub dir" / "run me.sh").write_text("echo 'ünï' {{output}}\n")
    spec_file = weird_tmp_path / "my spec.yaml"
    spec_file.write_text(_localpath_spec("sub dir/../sub dir/run me.sh"))
    [file] = spec.load(spec_file).workflow.groups[0].tasks[0].files
    assert (file.localpath, file.contents) == (
        "sub dir/../sub dir/run me.sh",
        "echo 'ünï' {{output}}\n",
    )


def test_localpath_tokens_are_not_checked_as_spec_tokens(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('{{host:nobody}}')\n")
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(_localpath_spec("train.py"))
    assert spec.load(spec_file)


@pytest.mark.parametrize(
    ("localpath", "reason"),
    [
        ("../outside.txt", "leads outside the spec's folder"),
        ("/etc/hostname", "is absolute; give it relative"),
        ("missing.txt", "does not exist in"),
        ("folder", "is a folder"),
        ("escape", "through a symbolic link"),
        ("binary.bin", "not UTF-8 text"),
    ],
)
def test_bad_localpaths(tmp_path: Path, localpath: str, reason: str) -> None:
    home = tmp_path / "spec"
    home.mkdir()
    (tmp_path / "outside.txt").write_text("secret")
    (home / "folder").mkdir()
    (home / "escape").symlink_to(tmp_path / "outside.txt")
    (home / "binary.bin").write_bytes(b"\xff\xfe\x00bad")
    spec_file = home / "s.yaml"
    spec_file.write_text(_localpath_spec(localpath))
    problem = only_problem(spec_file)
    assert problem.path == "workflow.tasks[0].files[0].localpath"
    assert reason in problem.message
    assert problem.file == str(spec_file) and problem.line == 3


def test_a_symlink_inside_the_folder_is_fine(tmp_path: Path) -> None:
    (tmp_path / "real.sh").write_text("echo hi\n")
    (tmp_path / "link.sh").symlink_to(tmp_path / "real.sh")
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(_localpath_spec("link.sh"))
    assert spec.load(spec_file).workflow.groups[0].tasks[0].files[0].contents == "echo hi\n"


def test_unreadable_localpath_is_reported(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    secret = tmp_path / "secret.sh"
    secret.write_text("x")
    secret.chmod(0)
    (tmp_path / "s.yaml").write_text(_localpath_spec("secret.sh"))
    assert "cannot be read" in only_problem(tmp_path / "s.yaml").message


def test_localpath_files_can_travel_with_the_spec_text() -> None:
    text = _localpath_spec("./scripts/run.sh")
    doc = spec.load(text, files={"scripts/run.sh": "echo inline\n"})
    assert doc.workflow.groups[0].tasks[0].files[0].contents == "echo inline\n"
    assert "was not sent with the spec" in only_problem(text, files={}).message
    assert "leads outside" in only_problem(_localpath_spec("../x"), files={"../x": "no"}).message


def test_localpath_without_a_folder_says_how_to_fix_it() -> None:
    assert "load the spec from its file" in only_problem(_localpath_spec("run.sh")).message


def test_contents_and_localpath_together_are_refused() -> None:
    text = workflow(
        "tasks: [{name: t, command: [x], files: [{path: /a, contents: x, localpath: y}]}]\n"
    )
    problem = only_problem(text, files={"y": "z"})
    assert (problem.path, problem.message) == (
        "workflow.tasks[0].files[0]",
        "give contents or localpath, not both",
    )


# pool fit and mounts


def _resources_spec(resource: str) -> str:
    return workflow(f"resources:\n  default: {resource}\ntasks: [{{name: t, command: [x]}}]\n")


@pytest.mark.parametrize(
    ("resource", "path", "reason"),
    [
        (
            "{cpu: 65}",
            "workflow.resources.default.cpu",
            "asks for 65 cores but the largest node of pool 'osmo' has 64 cores",
        ),
        (
            "{cpu: 1, gpu: 9}",
            "workflow.resources.default.gpu",
            "asks for 9 GPUs but the largest node",
        ),
        ("{memory: 513Gi}", "workflow.resources.default.memory", "asks for 513Gi memory"),
        (
            "{storage: 3Ti, platform: dgx-h100}",
            "workflow.resources.default.storage",
            "largest node of pool 'osmo' (platform dgx-h100) has 2Ti storage",
        ),
        (
            "{platform: gb200}",
            "workflow.resources.default.platform",
            "platform 'gb200' is not offered by pool 'osmo'; valid platforms: agx-orin-jp6, dgx-h100, ovx-a40, ovx-l40",
        ),
        (
            "{platform: ovx-a40, nodesExcluded: [ovx-a40-0, ovx-a40-1]}",
            "workflow.resources.default.nodesExcluded",
            "excludes every node of pool 'osmo' (platform ovx-a40)",
        ),
    ],
)
def test_requests_that_no_node_can_hold(resource: str, path: str, reason: str) -> None:
    problem = only_problem(_resources_spec(resource), pool=osmo_pool())
    assert problem.path == path and reason in problem.message and problem.line is not None


def test_a_request_is_checked_on_the_nodes_left_after_exclusion() -> None:
    pool = Pool(name="p", nodes=[NodeSpec(name="big", cpu=64), NodeSpec(name="small", cpu=4)])
    assert spec.load(_resources_spec("{cpu: 8, nodesExcluded: [small]}"), pool=pool)
    problem = only_problem(_resources_spec("{cpu: 8, nodesExcluded: [big]}"), pool=pool)
    assert "has 4 cores" in problem.message


def test_a_request_must_fit_one_node_as_a_whole() -> None:
    pool = Pool(
        name="p", nodes=[NodeSpec(name="cpu", cpu=64, gpu=0), NodeSpec(name="gpu", cpu=4, gpu=8)]
    )
    problem = only_problem(_resources_spec("{cpu: 32, gpu: 8}"), pool=pool)
    assert (problem.path, problem.message) == (
        "workflow.resources.default",
        "no single node of pool 'p' holds all of this request at once; ask for less of one resource",
    )


def test_platforms_on_a_pool_without_platforms() -> None:
    problem = only_problem(_resources_spec("{platform: dgx-h100}"))
    assert "pool 'local', which declares no platforms" in problem.message


def test_unused_resource_specs_are_not_fitted() -> None:
    text = workflow("resources:\n  huge: {cpu: 100000}\ntasks: [{name: t, command: [x]}]\n")
    assert spec.load(text)


def test_every_mount_is_refused_on_the_default_pool_with_the_way_to_allow_it() -> None:
    problem = only_problem(workflow("tasks: [{name: t, command: [x], volumeMounts: [/dev/shm]}]\n"))
    assert problem.message == (
        "volume mount source '/dev/shm' is not allowed on pool 'local' (allowed: none); "
        "an administrator can allow it by adding it to options.allowed_mounts of the "
        "pool in pools.yaml"
    )


@pytest.mark.parametrize(
    ("mount", "allowed"),
    [
        ("/dev/shm", True),
        ("/data/sets/a:/mnt", True),
        ("/data:/data", True),
        ("/database", False),
        ("/opt", False),
        ("/data/../etc", False),
    ],
)
def test_mounts_allowed_by_the_pool(mount: str, allowed: bool) -> None:
    pool = osmo_pool(allowed_mounts=["/dev/shm", "/data/"])
    text = workflow(f"tasks: [{{name: t, command: [x], volumeMounts: ['{mount}']}}]\n")
    assert (spec.validate(text, pool=pool) == []) is allowed


def test_a_pool_can_be_chosen_from_the_spec() -> None:
    chosen: list[str | None] = []

    def lookup(name: str | None) -> Pool:
        chosen.append(name)
        return osmo_pool(name=name or "none")

    text = workflow(
        "pool: gpu-pool\nresources: {default: {platform: dgx-h100}}\ntasks: [{name: t, command: [x]}]\n"
    )
    assert spec.load(text, pool=lookup) and chosen == ["gpu-pool"]


def test_check_pool_rechecks_a_stored_workflow_against_another_pool() -> None:
    doc = spec.load(_resources_spec("{gpu: 8, platform: dgx-h100}"), pool=osmo_pool())
    assert spec.check_pool(doc.workflow, osmo_pool()) == []
    small = Pool(name="small", nodes=[NodeSpec(name="n", gpu=2, platform="dgx-h100")])
    [problem] = spec.check_pool(doc.workflow, small)
    assert problem.path == "workflow.resources.default.gpu" and problem.line is None


# lines


def test_lines_point_at_keys_items_and_block_scalar_lines() -> None:
    text = dedent("""
        workflow:
          name: w
          tasks:
          - name: t
            command: [sh]
            files:
            - path: /tmp/run.sh
              contents: |
                echo 1
                echo 2
                ping {{host:nobody}}
    """)
    problem = _only(strict_problems(text))
    assert problem.line == 11 and "{{host:nobody}}" in text.splitlines()[10]


def test_a_missing_field_points_at_its_parent() -> None:
    text = "workflow:\n  name: w\n  tasks:\n  - name: t\n    image: x\n"
    problem = only_problem(text)
    assert (problem.path, problem.line) == ("workflow.tasks[0].command", 4)


def test_long_name_lists_in_messages_are_cut() -> None:
    tasks = ", ".join(f"{{name: t{i}, command: [x]}}" for i in range(20))
    text = workflow(f"tasks: [{tasks}, {{name: last, command: [x], inputs: [{{task: nope}}]}}]\n")
    message = only_problem(text).message
    assert message.endswith("name one of the tasks: t0, t1, t2, t3, t4, t5, t6, t7 and 13 more")


def test_a_pool_without_nodes_holds_nothing() -> None:
    problem = only_problem(_resources_spec("{cpu: 1}"), pool=Pool(name="empty", nodes=[]))
    assert (problem.path, problem.message) == (
        "workflow.resources.default",
        "pool 'empty' has no nodes; give it nodes or use another pool",
    )


def test_a_group_larger_than_a_node_per_task_pool_is_refused() -> None:
    nodes = [NodeSpec(name=f"n{i}") for i in range(2)]
    text = workflow(
        "groups:\n- name: trio\n  tasks:\n  - {name: a, command: [x], lead: true}\n"
        "  - {name: b, command: [x]}\n  - {name: c, command: [x]}\n"
    )
    assert spec.load(text, pool=Pool(name="many", nodes=nodes))  # tasks may share a node here
    problem = only_problem(text, pool=Pool(name="hpc", backend="slurm", nodes=nodes))
    assert problem.path == "workflow.groups[0]" and problem.line is not None
    assert problem.message.startswith(
        "group 'trio' has 3 tasks but pool 'hpc' has 2 nodes, "
        "and on a slurm pool each task of a group runs on a node"
    )


def test_a_gang_asking_more_than_the_pool_holds_in_total_is_refused_with_the_numbers() -> None:
    """Issue 12, H4: 500 tasks of 1 core, started together, on 4 nodes of 64 cores."""
    nodes = [NodeSpec(name=f"n{i}", cpu=64) for i in range(4)]
    tasks = "".join(
        f"  - {{name: t{i}, command: [x]{', lead: true' if i == 0 else ''}}}\n" for i in range(500)
    )
    text = workflow("resources:\n  default: {cpu: 1}\ngroups:\n- name: huge\n  tasks:\n" + tasks)
    problem = only_problem(text, pool=Pool(name="p", nodes=nodes))
    assert problem.path == "workflow.groups[0]"
    assert problem.message.startswith(
        "group 'huge' starts its 500 tasks together and they ask for 500 cores in total (cpu), "
        "but pool 'p' has 256 cores in total"
    )
    fits = "".join(
        f"  - {{name: t{i}, command: [x]{', lead: true' if i == 0 else ''}}}\n" for i in range(256)
    )
    assert spec.load(
        workflow("resources:\n  default: {cpu: 1}\ngroups:\n- name: full\n  tasks:\n" + fits),
        pool=Pool(name="p", nodes=nodes),
    )


def test_a_gangs_total_counts_every_node_one_of_its_tasks_may_use() -> None:
    """Tasks of one gang that exclude different nodes may use, together, the union of their
    nodes: 200 cores on 4 x 64 fit although each kind of task may use only 192."""
    nodes = [NodeSpec(name=f"n{i}", cpu=64) for i in range(4)]
    tasks = "".join(
        f"  - {{name: t{i}, command: [x], resource: {'left' if i % 2 else 'right'}"
        f"{', lead: true' if i == 0 else ''}}}\n"
        for i in range(200)
    )
    resources = (
        "resources:\n  left: {cpu: 1, nodesExcluded: [n0]}\n"
        "  right: {cpu: 1, nodesExcluded: [n1]}\n"
    )
    text = workflow(resources + "groups:\n- name: mixed\n  tasks:\n" + tasks)
    assert spec.load(text, pool=Pool(name="p", nodes=nodes))
    alone = tasks.replace("resource: right", "resource: left")
    problem = only_problem(
        workflow(resources + "groups:\n- name: mixed\n  tasks:\n" + alone),
        pool=Pool(name="p", nodes=nodes),
    )
    assert "ask for 200 cores in total (cpu), but pool 'p' has 192 cores" in problem.message


def test_a_host_token_naming_no_task_is_a_warning_with_the_groups_tasks() -> None:
    """Issue 25: OSMO accepts it (the token stays as written and fails at run time); the
    hint names the group's tasks rather than asking to put both in one group."""
    text = workflow("""
        groups:
        - name: nim
          tasks:
          - {name: run-server, lead: true, command: [sleep, "1"]}
          - {name: nim-client, command: [sh, -c, "curl http://{{host:nim-server}}:8000"]}
    """)
    doc = spec.load(text)
    assert len(doc.warnings) == 1
    assert (
        "no task named 'nim-server'; group 'nim' has run-server, nim-client"
        in doc.warnings[0].message
    )
    assert doc.warnings[0].path == "workflow.groups[0].tasks[1].command[2]"
