"""The pure parts of bench/launch_overhead.py (issue 15): the no-upload variant of the
example and the per-stage breakdown read from a run's recorded times."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import sys
from pathlib import Path
from types import ModuleType

import pytest

from trainyard.spec.api import validate

BENCH = Path(__file__).resolve().parents[2] / "bench" / "launch_overhead.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trainyard_bench_launch_overhead", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_no_upload_spec_is_the_example_without_outputs(bench: ModuleType, tmp_path: Path) -> None:
    assert "\n      outputs:" in bench.EXAMPLE.read_text()
    plain = bench.no_upload_spec(tmp_path)
    text = plain.read_text()
    assert "\n      outputs:" not in text and "name: {{ output_dataset }}" not in text
    assert "--node_rank 0" in text and "--node_rank 1" in text  # both tasks kept
    assert validate(plain, set_values={"n_gpus_per_node": 1}) == []


def _write_events(folder: Path, times: dict[str, float]) -> None:
    folder.mkdir(parents=True)
    lines = [
        json.dumps(
            {"kind": k, "time_s": t, "exit_code": 0 if k == "EXITED" else None, "message": ""}
        )
        for k, t in times.items()
    ]
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")


def _finished_run(home: Path, wid: str) -> Path:
    """A store row and the two runners' events of a COMPLETED 2-node run; returns its runs
    folder."""
    with sqlite3.connect(home / "trainyard.db") as db:
        db.execute(
            "CREATE TABLE workflows (id TEXT, status TEXT, submit_time_s REAL, end_time_s REAL)"
        )
        db.execute("INSERT INTO workflows VALUES (?, 'COMPLETED', 100.5, 106.0)", (wid,))
    runs = home / "runs" / wid
    _write_events(runs / "master" / "0", {"INITIALIZING": 100.6, "RUNNING": 100.7, "EXITED": 106.0})
    _write_events(
        runs / "worker" / "0", {"INITIALIZING": 100.62, "RUNNING": 100.75, "EXITED": 105.9}
    )
    return runs


def test_breakdown_splits_the_wall_time_into_the_recorded_stages(
    bench: ModuleType, tmp_path: Path
) -> None:
    home, wid = tmp_path, "train-multi-gpu-1"
    runs = _finished_run(home, wid)
    (runs / "master" / "0" / "timings.jsonl").write_text(
        json.dumps({"stage": "barrier_start", "time_s": 100.65})
        + "\n"
        + json.dumps({"stage": "command_exit", "time_s": 105.5})
        + "\n"
        + json.dumps({"stage": "upload_end", "time_s": 105.9})
        + "\n"
    )
    (runs / "worker" / "0" / "timings.jsonl").write_text(
        json.dumps({"stage": "barrier_start", "time_s": 100.7}) + "\n"
    )

    class Watch:
        ended = {wid: ("COMPLETED", 106.05)}

    stages = bench.breakdown(home, wid, 100.0, 106.25, Watch())
    expected = [0.5, 0.1, 0.1, 0.05, 4.75, 0.4, 0.1, 0.05, 0.2]
    assert list(stages) == list(bench.STAGES)
    assert [round(v, 3) for v in stages.values()] == expected
    assert sum(stages.values()) == pytest.approx(106.25 - 100.0)


def test_breakdown_of_a_runner_without_barrier_marks_counts_the_barrier_as_preparation(
    bench: ModuleType, tmp_path: Path
) -> None:
    home, wid = tmp_path, "train-multi-gpu-1"
    _finished_run(home, wid)

    class Watch:
        ended = {wid: ("COMPLETED", 106.05)}

    stages = bench.breakdown(home, wid, 100.0, 106.25, Watch())
    assert round(stages["gang start skew + runner preparation"], 3) == 0.15
    assert stages["barrier passed"] == 0
