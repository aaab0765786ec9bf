"""OSMO's REJECTED rows through ``trainyard workflow submit``: a non-zero exit, every problem
on its own line of stderr, and no workflow created."""

from __future__ import annotations

import re

import pytest
from cli_e2e_support import SPECS, Server

pytestmark = pytest.mark.skipif(not SPECS.is_dir(), reason=f"OSMO specs not found at {SPECS}")

OSMO = ("--pool", "osmo")
# (spec, extra arguments, pattern that one stderr line must match)
REJECTED = [
    ("tests/empty_command.yaml", (), r"workflow\.tasks\[0\]\.command: .*'command' is missing"),
    ("tests/bad_command.yaml", (), r"workflow\.tasks\[0\]\.command: command is empty"),
    ("tests/template_unsafe.yaml", (), r"breaks the sandbox.*__class__"),
    ("tests/template_too_much_cpu.yaml", (), r"ran past its time limit"),
    ("tests/template_too_much_memory.yaml", (), r"ran past its (time|memory) limit"),
    ("tests/invalid_mount.yaml", (), r"volumeMounts\[0\]: .*'/bad_mount' is not allowed"),
    ("tests/invalid_src_dest_mount.yaml", (), r"volumeMounts\[0\]: .*more than one ':'"),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("--set", "cpu=1000000", *OSMO),
        r"resources\.default\.cpu: .*1000000 cores",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("--set", "storage=1000000Gi", *OSMO),
        r"resources\.default\.storage: .*1000000Gi storage",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("--set", "memory=1000000Gi", *OSMO),
        r"resources\.default\.memory: .*1000000Gi memory",
    ),
    (
        "tests/bad_resource_workflow_v2.yaml",
        ("--set", "platform=bad-platform", *OSMO),
        r"resources\.default\.platform: .*'bad-platform'.*agx-orin-jp6, dgx-h100",
    ),
    (
        "scenarios/workflow_labels.yaml",
        ("--set", "nested_team=true"),
        r"workflow\.labels\.team: .*label value must be a string",
    ),
    (
        "scenarios/workflow_labels.yaml",
        ("--set", "team_yaml=", "--label", "team="),
        r"label value must be non-empty",
    ),
]
LINE = re.compile(r"^\S.*?(:\d+)?: .+$")  # FILE[:LINE]: [PATH:] MESSAGE


@pytest.mark.parametrize(
    ("rel", "args", "pattern"), REJECTED, ids=[f"{r[0]}[{' '.join(r[1])}]" for r in REJECTED]
)
def test_rejected_row_exits_non_zero_prints_each_problem_and_creates_nothing(
    server: Server, rel: str, args: tuple[str, ...], pattern: str
) -> None:
    before = server.ids()
    got = server.main("workflow", "submit", str(SPECS / rel), *args)
    assert got.code == 2, (got.out, got.err)
    assert got.out == ""
    lines = got.err.splitlines()
    assert lines and all(LINE.match(line) for line in lines), got.err
    assert any(re.search(pattern, line) for line in lines), got.err
    assert len(lines) == len(set(lines)), "a problem printed twice"
    assert server.ids() == before


def test_a_rejected_submit_as_a_process_exits_2(server: Server) -> None:
    before = server.ids()
    got = server.cli("workflow", "submit", str(SPECS / "tests/invalid_mount.yaml"), "--wait")
    assert got.code == 2
    assert got.out == ""
    assert "invalid_mount.yaml:" in got.err and "/bad_mount" in got.err
    assert server.ids() == before


def test_the_default_of_a_rejected_spec_still_validates_on_the_osmo_pool(server: Server) -> None:
    got = server.main(
        "workflow",
        "submit",
        str(SPECS / "tests/bad_resource_workflow_v2.yaml"),
        "--pool",
        "osmo",
        "--dry-run",
        "-t",
        "json",
    )
    assert got.json()["pool"] == "osmo"


def test_a_gang_larger_than_the_pool_is_refused_with_the_numbers(server: Server, tmp_path) -> None:
    """Issue 12, H4: accepted, it would wait forever and hold the queue; refused, it says
    what it asks and what the pool has."""
    tasks = "".join(
        f"    - {{name: t{i}, command: [true]{', lead: true' if i == 0 else ''}}}\n"
        for i in range(500)
    )
    spec = tmp_path / "gang.yaml"
    spec.write_text(
        "workflow:\n  name: huge\n  resources:\n    default: {cpu: 1}\n"
        "  groups:\n  - name: g\n    tasks:\n" + tasks.replace("[true]", "['true']")
    )
    before = server.ids()
    got = server.main("workflow", "submit", str(spec), *OSMO)
    assert got.code == 2, (got.out, got.err)
    assert got.err.splitlines() == [
        f"{spec}:6: workflow.groups[0]: group 'g' starts its 500 tasks together and they ask "
        "for 500 cores in total (cpu), but pool 'osmo' has 256 cores in total on the nodes "
        "they may use; ask for less per task, use fewer tasks, or use a bigger pool"
    ]
    assert server.ids() == before
