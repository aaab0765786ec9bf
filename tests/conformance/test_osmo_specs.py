"""OSMO's own specs: each REJECTED row of shared/osmo-specs/EXPECTATIONS.md is refused for
its reason, and every other spec validates (with the arguments the table gives).

The specs live beside the repository (``../shared/osmo-specs``); CI clones the repo with
``shared/`` next to it. Without them the module is skipped.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from trainyard import spec
from trainyard.errors import SpecError, SpecProblem
from trainyard.pools import NodeSpec, Pool, default_local_pool

SPECS = (Path(__file__).resolve().parents[2] / ".." / "shared" / "osmo-specs").resolve()
if not SPECS.is_dir():
    pytest.skip(
        f"OSMO conformance specs not found at {SPECS} (shared/ must sit beside the repo)",
        allow_module_level=True,
    )

# The specs' data live below a data root the test pools list (``options.allowed_data_roots``):
# the default roots are the home's storage folder only, never /tmp (issue 11).
DATA_ROOT = "/srv/osmo-data"
DATA_SETS = (f"storage_url=file://{DATA_ROOT}/x", f"upload_location=file://{DATA_ROOT}/x")
# Specs that name OSMO's platforms run against a pool like OSMO's test deployment.
OSMO_POOL_SPECS = {
    "tutorials/resources_platforms.yaml",
    "tutorials/robot_simulation.yaml",
    "tests/bad_resource_workflow_v2.yaml",
}


def osmo_pool() -> Pool:
    """ovx-a40, ovx-l40, dgx-h100, agx-orin-jp6; 8 GPUs, 64 CPUs, 512 GiB, 2 TiB per node."""
    platforms = ("ovx-a40", "ovx-l40", "dgx-h100", "agx-orin-jp6")
    nodes = [
        NodeSpec(name=f"{p}-{i}", platform=p, gpu=8, cpu=64, memory="512Gi", storage="2Ti")
        for p in platforms
        for i in range(2)
    ]
    return Pool(name="osmo", nodes=nodes)


def pool_for(rel: str) -> Pool:
    pool = osmo_pool() if rel in OSMO_POOL_SPECS else default_local_pool()
    return pool.model_copy(update={"options": {"allowed_data_roots": [DATA_ROOT]}})


def load(rel: str, sets: tuple[str, ...] = (), labels: tuple[str, ...] = ()) -> spec.SpecDocument:
    return spec.load(
        SPECS / rel,
        set_values=spec.parse_set_values(sets),
        labels=spec.parse_labels(labels),
        pool=pool_for(rel),
    )


def refusal(
    rel: str, sets: tuple[str, ...] = (), labels: tuple[str, ...] = ()
) -> list[SpecProblem]:
    with pytest.raises(SpecError) as caught:
        load(rel, sets, labels)
    return caught.value.problems


# (spec, --set args, --label args, field path of the problem or None, reason pattern)
REJECTED: list[tuple[str, tuple[str, ...], tuple[str, ...], str | None, str]] = [
    ("tests/empty_command.yaml", (), (), "workflow.tasks[0].command", r"'command' is missing"),
    ("tests/bad_command.yaml", (), (), "workflow.tasks[0].command", r"command is empty"),
    ("tests/template_unsafe.yaml", (), (), None, r"breaks the sandbox.*__class__"),
    ("tests/template_too_much_cpu.yaml", (), (), None, r"ran past its time limit"),
    # EXPECTATIONS names the memory limit. In Jinja 3.1 a ``set`` inside a loop body starts
    # again from the outer value each iteration, so this template never grows ``x``: it is a
    # CPU bomb in disguise, and the time limit stops it first. A real memory bomb is covered
    # by tests/unit/spec/test_spec_template.py.
    ("tests/template_too_much_memory.yaml", (), (), None, r"ran past its (time|memory) limit"),
    (
        "tests/invalid_mount.yaml",
        (),
        (),
        "workflow.tasks[0].volumeMounts[0]",
        r"'/bad_mount' is not allowed on pool 'local'.*options\.allowed_mounts",
    ),
    (
        "tests/invalid_src_dest_mount.yaml",
        (),
        (),
        "workflow.tasks[0].volumeMounts[0]",
        r"more than one ':'",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("cpu=1000000",),
        (),
        "workflow.resources.default.cpu",
        r"1000000 cores.*has 64 cores",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("storage=1000000Gi",),
        (),
        "workflow.resources.default.storage",
        r"1000000Gi storage.*has 2Ti storage",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("memory=1000000Gi",),
        (),
        "workflow.resources.default.memory",
        r"1000000Gi memory.*has 512Gi memory",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("platform=bad-platform",),
        (),
        "workflow.resources.default.platform",
        r"'bad-platform'.*valid platforms: agx-orin-jp6, dgx-h100, ovx-a40, ovx-l40",
    ),
    (
        "scenarios/workflow_labels.yaml",
        ("nested_team=true",),
        (),
        "workflow.labels.team",
        r"label value must be a string",
    ),
    (
        "scenarios/workflow_labels.yaml",
        ("team_yaml=",),
        ("team=",),
        "workflow.labels.team",
        r"label value must be non-empty",
    ),
]

# Rows of "Must reach the outcome" and "Must validate" with their arguments.
VALID: list[tuple[str, tuple[str, ...]]] = [
    ("tutorials/template_hello_world.yaml", ("workflow_name=greetings", "message=Custom message!")),
    ("tutorials/data_filter.yaml", (f"storage_url=file://{DATA_ROOT}/some/dir",)),
    ("tests/exit_actions.yaml", ("code=1",)),
    ("tests/group_actions.yaml", ("ignore_nonlead_status=true",)),
    ("tests/group_actions.yaml", ("ignore_nonlead_status=false",)),
    ("scenarios/workflow_labels.yaml", ("exit_code=0",)),
    ("scenarios/workflow_labels.yaml", ("exit_code=1",)),
]
REJECTED_ONLY = {row[0] for row in REJECTED} - {
    "tests/bad_resource_workflow_v2.yaml",
    "scenarios/workflow_labels.yaml",
}
ALL_SPECS = sorted(str(p.relative_to(SPECS)) for p in SPECS.rglob("*.yaml"))


@pytest.mark.parametrize(
    ("rel", "sets", "labels", "path", "reason"),
    REJECTED,
    ids=[f"{r[0]}{'[' + ' '.join(r[1] + r[2]) + ']' if r[1] or r[2] else ''}" for r in REJECTED],
)
def test_rejected_rows_are_refused_for_their_reason(
    rel: str, sets: tuple[str, ...], labels: tuple[str, ...], path: str | None, reason: str
) -> None:
    found = refusal(rel, sets, labels)
    matching = [p for p in found if re.search(reason, p.message)]
    assert matching, "\n".join(map(str, found))
    problem = matching[0]
    assert problem.file == str(SPECS / rel)
    if path is not None:
        assert problem.path == path
        assert problem.line is not None


@pytest.mark.parametrize("rel", [r for r in ALL_SPECS if r not in REJECTED_ONLY])
def test_every_other_spec_validates_with_its_defaults(rel: str) -> None:
    needs_data = rel.startswith("dnn_training/") or rel == "tutorials/data_filter.yaml"
    doc = load(rel, DATA_SETS if needs_data else ())
    assert doc.workflow.groups and all(
        len([t for t in g.tasks if t.lead]) == 1 for g in doc.workflow.groups
    )


@pytest.mark.parametrize(("rel", "sets"), VALID, ids=[f"{r[0]}[{' '.join(r[1])}]" for r in VALID])
def test_outcome_rows_validate_with_their_arguments(rel: str, sets: tuple[str, ...]) -> None:
    assert load(rel, sets).workflow.all_tasks()


def test_every_spec_of_the_corpus_is_covered() -> None:
    covered = {row[0] for row in REJECTED} | {row[0] for row in VALID} | set(ALL_SPECS)
    assert set(ALL_SPECS) <= covered
    assert REJECTED_ONLY <= set(ALL_SPECS), "a REJECTED row names a file that is not there"


def test_template_values_reach_the_spec() -> None:
    doc = load(
        "tutorials/template_hello_world.yaml",
        ("workflow_name=greetings", "message=Custom message!"),
    )
    assert doc.workflow.name == "greetings"
    assert doc.workflow.groups[0].tasks[0].args == ["Custom message!"]


def test_exit_actions_spec_maps_its_code() -> None:
    task = load("tests/exit_actions.yaml").workflow.groups[0].tasks[0]
    assert task.exit_actions == {spec.ExitAction.COMPLETE: frozenset({15})}
    assert "exit 15" in (task.files[0].contents or "")


def test_group_actions_value_reaches_the_group() -> None:
    doc = load("tests/group_actions.yaml", ("ignore_nonlead_status=true",))
    assert doc.workflow.groups[0].ignore_nonlead_status is True
    assert load("tests/group_actions.yaml").workflow.groups[0].ignore_nonlead_status is False


def test_tokens_survive_in_the_osmo_specs() -> None:
    doc = load("tests/parallel_workflow_v2.yaml")
    client = doc.workflow.groups[0].tasks[1]
    assert "{{host:server}}" in (client.files[0].contents or "")
    assert "{{output}}/tcp_echo.txt" in (client.files[0].contents or "")


def test_deepspeed_hostfile_builds_host_tokens_for_every_worker() -> None:
    doc = load("dnn_training/deepspeed_multinode/train.yaml", DATA_SETS + ("n_nodes=3",))
    hostfile = next(f for f in doc.workflow.groups[0].tasks[0].files if f.path == "/tmp/hostfile")
    assert "{{host:worker_1}} slots=4" in (hostfile.contents or "")
    assert "{{host:worker_2}} slots=4" in (hostfile.contents or "")


def test_localpath_files_are_read_into_contents() -> None:
    doc = load("dnn_training/torchrun_multinode/train.yaml", DATA_SETS)
    train = next(f for f in doc.workflow.groups[0].tasks[0].files if f.path == "/tmp/train.py")
    assert train.localpath == "train.py"
    assert train.contents == (SPECS / "dnn_training/torchrun_multinode/train.py").read_text()


def _options(rel: str) -> dict[str, Any]:
    return {"pool": pool_for(rel)}


def test_validate_returns_no_problems_for_a_good_spec_and_all_for_a_bad_one() -> None:
    assert (
        spec.validate(
            SPECS / "tutorials/hello_world.yaml", **_options("tutorials/hello_world.yaml")
        )
        == []
    )
    found = spec.validate(
        SPECS / "tests/invalid_mount.yaml", **_options("tests/invalid_mount.yaml")
    )
    assert [p.path for p in found] == ["workflow.tasks[0].volumeMounts[0]"]
