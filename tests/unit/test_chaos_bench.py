"""The pure parts of bench/chaos.py (issue 12's fault-injection harness): the mix of
workflows, the specs it submits, which kills must change a workflow's status, the run-twice
rule, the report, and the leak finder against real processes. The harness itself (real
server, kills) runs as a benchmark, not here.
"""

from __future__ import annotations

import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainyard.spec.api import validate

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chaos.py"


def load_chaos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainyard_bench_chaos", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


chaos = load_chaos()
GANG_STRICT = chaos.WorkflowPlan(
    0,
    "gang",
    (
        chaos.GroupPlan(
            "gang",
            (chaos.TaskPlan("lead", True, 5), chaos.TaskPlan("worker1", False, 3)),
            ignore_nonlead=False,
        ),
    ),
)
GANG_LOOSE = chaos.WorkflowPlan(
    1,
    "gang",
    (
        chaos.GroupPlan(
            "gang",
            (chaos.TaskPlan("lead", True, 5), chaos.TaskPlan("worker1", False, 3)),
            ignore_nonlead=True,
        ),
    ),
)
RESCHEDULE = chaos.WorkflowPlan(
    2,
    "reschedule",
    (chaos.GroupPlan("train", (chaos.TaskPlan("trainer", True, 2, reschedule=True),)),),
)


def hit(
    task: str,
    time_s: float = 100.0,
    lead_exit_s: float | None = None,
    retry_id: int = 0,
    wf: str = "w-1",
) -> object:
    return chaos.Hit(wf, task, retry_id, "runner", time_s, lead_exit_s)


def test_the_mix_has_every_kind_and_its_specs_are_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path))
    plans = chaos.make_plans(6, random.Random(3))
    assert [p.kind for p in plans] == ["gang", "dag", "reschedule"] * 2
    assert plans == chaos.make_plans(6, random.Random(3))  # the seed decides it
    for plan in plans:
        text = chaos.render_spec(plan, (tmp_path / "storage").as_uri())
        assert validate(text) == [], plan.name
        sizes = [len(g.tasks) for g in plan.groups]
        if plan.kind == "gang":
            assert 2 <= sizes[0] <= 4 and "{{host:lead}}" in text
        if plan.kind == "dag":
            assert 2 <= len(sizes) <= 3 and '"task": "t0"' in text and '"dataset"' in text
        if plan.kind == "reschedule":
            assert '"RESCHEDULE": 42' in text and '"checkpoint"' in text


def test_a_hit_on_the_lead_fails_the_workflow_one_on_a_loose_worker_does_not() -> None:
    assert chaos.expected_statuses(GANG_STRICT, []) == {"COMPLETED"}
    assert chaos.expected_statuses(GANG_STRICT, [hit("lead")]) == {"FAILED"}
    assert chaos.expected_statuses(GANG_LOOSE, [hit("lead")]) == {"FAILED"}
    assert chaos.expected_statuses(GANG_LOOSE, [hit("worker1")]) == {"COMPLETED"}
    assert chaos.expected_statuses(RESCHEDULE, [hit("trainer", retry_id=1)]) == {"FAILED"}


def test_a_strict_worker_hit_counts_only_while_its_lead_runs() -> None:
    assert chaos.classify_hit(GANG_STRICT, hit("worker1", lead_exit_s=None)) == "decisive"
    assert chaos.classify_hit(GANG_STRICT, hit("worker1", 100.0, 110.0)) == "decisive"
    assert chaos.classify_hit(GANG_STRICT, hit("worker1", 100.0, 90.0)) == "moot"
    assert chaos.classify_hit(GANG_STRICT, hit("worker1", 100.0, 101.0)) == "ambiguous"
    assert chaos.expected_statuses(GANG_STRICT, [hit("worker1", 100.0, 101.0)]) == {
        "COMPLETED",
        "FAILED",
    }
    assert chaos.expected_statuses(GANG_STRICT, [hit("worker1", 100.0, 90.0)]) == {"COMPLETED"}


def test_extra_starts_flags_double_starts_and_unasked_retries() -> None:
    assert chaos.extra_starts(GANG_STRICT, {("lead", 0): 1, ("worker1", 0): 1}) == []
    assert chaos.extra_starts(GANG_STRICT, {("lead", 0): 2}) == ["lead retry 0 started 2 times"]
    assert chaos.extra_starts(GANG_STRICT, {("worker1", 1): 1}) == [
        "worker1 retry 1 started with no exit action asking"
    ]
    assert chaos.extra_starts(RESCHEDULE, {("trainer", 0): 1, ("trainer", 1): 1}) == []
    assert chaos.extra_starts(RESCHEDULE, {("trainer", 2): 1}) == [
        "trainer retry 2 started with no exit action asking"
    ]


def test_the_report_counts_each_kind_of_failure() -> None:
    plans = {"a-1": GANG_STRICT, "b-1": GANG_LOOSE, "c-1": RESCHEDULE, "d-1": GANG_LOOSE}
    final = {"a-1": "COMPLETED", "b-1": "RUNNING", "c-1": "COMPLETED"}  # d-1 vanished
    hits = [hit("lead", wf="a-1"), hit("worker1", wf="b-1")]
    starts = {"c-1": {("trainer", 0): 1, ("trainer", 1): 2}}
    leaks = {"processes": ["pid 7: bwrap ..."], "namespaces": [], "mounts": ["m1", "m2"]}
    report = chaos.build_report(
        plans, final, hits, starts, ["c-1: out"], leaks, {"server": 1, "runner": 1}, 12.0
    )
    assert report.counts == {
        "lost_workflows": 2,
        "tasks_run_twice": 1,
        "wrong_statuses": 1,
        "missing_outputs": 1,
        "leaked_processes": 1,
        "leaked_namespaces": 0,
        "leaked_mounts": 2,
    }
    assert report.details["wrong_statuses"] == [
        "a-1: COMPLETED, expected FAILED (runner killed lead retry 0)"
    ]
    assert report.failed
    table = chaos.format_table(report)
    assert "lost_workflows           2" in table and "d-1: gone" in table


def test_a_clean_run_reports_nothing() -> None:
    report = chaos.build_report(
        {"a-1": GANG_LOOSE},
        {"a-1": "COMPLETED"},
        [],
        {"a-1": {("lead", 0): 1}},
        [],
        {},
        {"server": 2},
        5.0,
    )
    assert not report.failed and set(report.counts.values()) == {0}


def test_find_leaks_sees_processes_naming_the_home_or_a_workflow(tmp_path: Path) -> None:
    home = tmp_path / "home"
    netns_before = chaos._run_netns()  # the machine's own, made before the test, are no leak
    named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(home)])
    task = subprocess.Popen(
        ["sleep", "60"], env={"PATH": os.environ["PATH"], "TRAINYARD_WORKFLOW_ID": "chaos-x-1"}
    )
    other = subprocess.Popen(["sleep", "60"])
    try:
        leaks = chaos.find_leaks(home, "trainyard-launcher-0000-", netns_before, ["chaos-x-1"])
        pids = {int(line.split(":")[0].split()[1]) for line in leaks["processes"]}
        assert {named.pid, task.pid} <= pids and other.pid not in pids
        assert leaks["mounts"] == []
    finally:
        for proc in (named, task, other):
            proc.kill()
            proc.wait()
    after = chaos.find_leaks(home, "trainyard-launcher-0000-", netns_before, ["chaos-x-1"])
    assert after == {"processes": [], "namespaces": [], "mounts": []}
