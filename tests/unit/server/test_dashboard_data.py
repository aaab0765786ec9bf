"""The dashboard's data functions: DAG columns, the Gantt phases of each attempt, metrics
files (the trainer's and the documented generic format), and Store.page_workflows."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trainyard.engine import machine as m
from trainyard.server import dashboard
from trainyard.status import Status
from trainyard.store import Store


def _state() -> m.WorkflowState:
    groups = {
        "prep": m.GroupState("prep", ["a"]),
        "train": m.GroupState("train", ["b", "c"], upstream=frozenset({"prep"})),
        "eval": m.GroupState("eval", ["d"], upstream=frozenset({"train", "prep"})),
    }
    tasks = {
        n: m.TaskState(n, g, lead=i == 0)
        for g, grp in groups.items()
        for i, n in enumerate(grp.tasks)
    }
    return m.WorkflowState("w-1", groups, tasks, submit_time_s=100.0)


def test_dag_columns_follow_the_deepest_upstream() -> None:
    boxes = {b.name: b for b in dashboard.dag_layout(_state())}
    assert (boxes["prep"].column, boxes["train"].column, boxes["eval"].column) == (0, 1, 2)
    assert boxes["train"].tasks == [("b", "PENDING", True), ("c", "PENDING", False)]


def _events(folder: Path, *rows: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "events.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_timeline_has_queued_initializing_running_per_attempt(tmp_path: Path) -> None:
    state = _state()
    a = state.tasks["a"]
    a.history.append(m.TaskAttempt(0, Status.FAILED, 1, "n0", 101.0, 110.0))
    a.retry_id, a.status, a.exit_code, a.end_time_s = 1, Status.COMPLETED, 0, 130.0
    _events(
        tmp_path / "a" / "0",
        {"kind": "INITIALIZING", "time_s": 101.0},
        {"kind": "RUNNING", "time_s": 103.0},
        {"kind": "EXITED", "time_s": 110.0, "exit_code": 1, "message": "boom"},
    )
    _events(
        tmp_path / "a" / "1",
        {"kind": "INITIALIZING", "time_s": 115.0},
        {"kind": "RUNNING", "time_s": 116.0},
    )
    bars = dashboard.timeline(state, lambda t, r: tmp_path / t / str(r), now_s=200.0)
    first, second = [b for b in bars if b.task == "a"]
    assert [(p.kind, p.start_s, p.end_s) for p in first.phases] == [
        ("QUEUED", 100.0, 101.0),
        ("INITIALIZING", 101.0, 103.0),
        ("RUNNING", 103.0, 110.0),
    ]
    assert first.reason == "boom" and first.exit_code == 1 and first.status == "FAILED"
    assert [(p.kind, p.start_s, p.end_s) for p in second.phases] == [
        ("QUEUED", 110.0, 115.0),
        ("INITIALIZING", 115.0, 116.0),
        ("RUNNING", 116.0, 130.0),
    ]
    never = next(b for b in bars if b.task == "d")
    assert [(p.kind, p.end_s) for p in never.phases] == [("QUEUED", 200.0)]


def test_read_metrics_generic_and_trainer_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 10, "loss": 0.5, "note": "text", "ok": True},
        {"event": "epoch", "epoch": 1, "total_epochs": 2, "val_loss": 1.5},
        {"event": "summary", "epoch": 2, "val_loss": 9.0},
        {"epoch": "2", "loss": 1.0},
        [1, 2],
    ]
    path.write_text("\n".join(map(json.dumps, rows[1:])) + "\nnot json\n")
    assert dashboard.read_curves(path) == ("epoch", {"val_loss": [(1.0, 1.5)]})
    other = tmp_path / "generic" / "metrics.jsonl"
    other.parent.mkdir()
    other.write_text("\n".join(map(json.dumps, rows)) + "\n")
    # One x axis per file, the first usable row's: the epoch rows have no step.
    assert dashboard.read_curves(other) == ("step", {"loss": [(10.0, 0.5)]})


def test_the_x_axis_is_the_datas_step_epoch_or_time(tmp_path: Path) -> None:
    """Issue 28: the chart's x axis was always `epoch`, even for `step` data."""
    cases = {
        "step": [{"step": 5, "epoch": 0, "loss": 1.0}, {"step": 10, "epoch": 0, "loss": 0.5}],
        "epoch": [
            {"event": "epoch", "epoch": 1, "time": "2026-11-27T02:11:13+00:00", "val_loss": 0.7}
        ],
        "time": [
            {"time": "2026-11-27T02:11:13.250000+00:00", "loss": 0.9},
            {"time": "2026-11-27T02:11:14", "loss": 0.8},  # no zone: UTC
            {"time": 1795745475.5, "loss": 0.7},
        ],
    }
    got = {}
    for name, rows in cases.items():
        path = tmp_path / name / "metrics.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        got[name] = dashboard.read_curves(path)
    assert got["step"] == ("step", {"loss": [(5.0, 1.0), (10.0, 0.5)]})
    assert got["epoch"] == ("epoch", {"val_loss": [(1.0, 0.7)]})
    assert got["time"] == (
        "time",
        {"loss": [(1795745473.25, 0.9), (1795745474.0, 0.8), (1795745475.5, 0.7)]},
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"loss": 1}\n')
    assert dashboard.read_curves(empty) == ("step", {})


def test_read_metrics_thins_long_runs_reads_only_new_bytes_and_rereads_a_new_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": i, "loss": 1 / (i + 1)}) + "\n" for i in range(20_000))
        + '{"step": 20000, "lo'
    )
    first = dashboard.read_metrics(path)["loss"]
    assert dashboard.MAX_POINTS <= len(first) <= 2 * dashboard.MAX_POINTS + 1
    assert first[0] == (0.0, 1.0) and first[-1][0] == 19_999.0  # whole run, newest kept
    with path.open("a") as handle:  # the torn line completes, one more comes
        handle.write('ss": 0.5}\n' + json.dumps({"step": 20001, "loss": 0.25}) + "\n")
    assert dashboard.read_metrics(path)["loss"][-2:][-1] == (20001.0, 0.25)
    path.unlink()
    path.write_text(json.dumps({"step": 1, "acc": 0.9}) + "\n")  # replaced: read anew
    assert dashboard.read_metrics(path) == {"acc": [(1.0, 0.9)]}


def test_read_metrics_of_a_file_over_the_read_bound_reads_its_newest_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "METRICS_READ_BYTES", 4096)
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "loss": 0.5}) + "\n" for i in range(2000)))
    loss = dashboard.read_metrics(path)["loss"]
    assert loss[-1] == (1999.0, 0.5) and loss[0][0] > 1800  # only the last ~4 KiB
    many = tmp_path / "many" / "metrics.jsonl"
    many.parent.mkdir()
    many.write_text(json.dumps({"step": 1, **{f"m{i}": i for i in range(100)}}) + "\n")
    assert len(dashboard.read_metrics(many)) == dashboard.MAX_SERIES


def test_metrics_files_are_found_three_folders_deep_at_most(tmp_path: Path) -> None:
    for rel in (
        "metrics.jsonl",
        "models/metrics.jsonl",
        "a/b/c/metrics.jsonl",
        "a/b/c/d/metrics.jsonl",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = [str(p.relative_to(tmp_path)) for p in dashboard.metrics_files(tmp_path)]
    assert found == ["a/b/c/metrics.jsonl", "metrics.jsonl", "models/metrics.jsonl"]


def test_page_workflows_counts_all_and_returns_one_page(tmp_path: Path) -> None:
    from trainyard.engine.serialize import state_to_dict  # noqa: PLC0415

    store = Store(f"sqlite:///{tmp_path / 'db'}")
    for i in range(12):
        store.create_workflow(
            name="w",
            spec_text="x",
            pool="p" if i % 2 else "q",
            submitted_by="u",
            labels={"i": str(i)},
            source={},
            make_state=lambda wid: ("PENDING", state_to_dict(_state())),
        )
    rows, total = store.page_workflows(offset=5, limit=4)
    assert total == 12 and [r["labels"]["i"] for r in rows] == ["6", "5", "4", "3"]
    assert "state" not in rows[0] and "spec_text" not in rows[0]
    rows, total = store.page_workflows(pool="p", labels={"i": "3"})
    assert total == 1 and rows[0]["pool"] == "p"


def test_each_point_keeps_its_rows_time_for_the_time_axis(tmp_path: Path) -> None:
    """Issue 28: step or time on the x axis, the user's choice, when the rows carry both."""
    path = tmp_path / "metrics.jsonl"
    rows = [
        {"step": 1, "time": "2026-11-27T02:11:13+00:00", "loss": 1.0},
        {"step": 2, "loss": 0.5},
        {"step": 3, "time": 1795745480.0, "loss": 0.25},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    x_name, series, times = dashboard.read_curves_and_times(path)
    assert x_name == "step" and series == {"loss": [(1.0, 1.0), (2.0, 0.5), (3.0, 0.25)]}
    assert times == {"loss": [1795745473.0, None, 1795745480.0]}
    no_time = tmp_path / "no-time.jsonl"
    no_time.write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    assert dashboard.read_curves_and_times(no_time)[2] == {}
    by_time = tmp_path / "by-time.jsonl"
    by_time.write_text(json.dumps({"time": 1795745480.0, "loss": 1.0}) + "\n")
    assert dashboard.read_curves_and_times(by_time) == ("time", {"loss": [(1795745480.0, 1.0)]}, {})


def test_thinning_keeps_points_and_times_together(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text(
        "".join(json.dumps({"step": i, "time": 1000.0 + i, "loss": i}) + "\n" for i in range(5000))
    )
    _, series, times = dashboard.read_curves_and_times(path)
    assert len(series["loss"]) == len(times["loss"])
    assert all(t == 1000.0 + x for (x, _), t in zip(series["loss"], times["loss"], strict=False))


def test_the_metrics_search_is_bounded_whatever_folders_a_task_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: a task can make a million folders in its output, and the search for its
    metrics files (on every poll of the workflow page) globbed them all. Now it looks at
    ``MAX_SCAN_ENTRIES`` entries at most, shallow files first, and follows no link."""
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    flood = tmp_path / "flood"
    for i in range(300):
        (flood / str(i) / "x").mkdir(parents=True)
    (tmp_path / "link").symlink_to(flood)
    seen = []
    real_scandir = os.scandir

    class Counting:
        def __init__(self, path: Any) -> None:
            self.inner = real_scandir(path)

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            self.inner.close()

        def __iter__(self) -> Any:
            for entry in self.inner:
                seen.append(entry.path)
                yield entry

    monkeypatch.setattr(dashboard, "MAX_SCAN_ENTRIES", 100)
    monkeypatch.setattr(dashboard.os, "scandir", Counting)
    found = dashboard.metrics_files(tmp_path)
    assert found == [tmp_path / "metrics.jsonl"]
    assert 0 < len(seen) <= 101, len(seen)
    assert not any(p.startswith(str(tmp_path / "link") + "/") for p in seen)
