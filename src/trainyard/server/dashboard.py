"""What the dashboard shows, computed from the engine's state and the run folders (no HTTP).

- ``dag_layout``: groups placed in columns by depth (upstream groups to the left), for the
  workflow page's SVG.
- ``timeline``: each task attempt's phases (queued, initializing, running) from the
  workflow's submit time and the runner's ``events.jsonl``, with exit code and reason.
- ``curves``: training curves from ``metrics.jsonl`` files under a task's output folder
  (the trainer's, or any program's in the format of docs/dashboard.md).
- ``usage``: the runner's ``usage.jsonl`` samples (``trainyard.runner.usage``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainyard.engine import machine as m
from trainyard.runner.report import EVENTS, read_events
from trainyard.runner.usage import read_usage

__all__ = ["DagBox", "dag_layout", "Phase", "AttemptBar", "timeline", "metrics_files",
           "read_metrics", "curves", "usage", "usage_summary", "RunDir", "METRICS_FILE",
           "MAX_METRIC_ROWS"]

METRICS_FILE = "metrics.jsonl"
MAX_METRIC_ROWS = 10_000
"""Lines read from one metrics file (the last ones), so a runaway writer cannot stall a page."""
_SKIP_FIELDS = {"epoch", "step", "time", "event", "total_epochs", "snapshot_saved", "injected"}

RunDir = Callable[[str, int], Path]
"""(task, retry_id) -> the attempt's run folder."""


# --------------------------------------------------------------------------- DAG


@dataclass(frozen=True)
class DagBox:
    """One group on the DAG: its column (depth), row, and the tasks with their status."""

    name: str
    status: str
    column: int
    row: int
    tasks: list[tuple[str, str, bool]]
    """(task name, status, lead)"""
    upstream: list[str]


def dag_layout(state: m.WorkflowState) -> list[DagBox]:
    """Groups in columns: a group's column is one more than its deepest upstream group."""
    depth: dict[str, int] = {}

    def depth_of(name: str, seen: frozenset[str] = frozenset()) -> int:
        if name not in depth:
            ups = [u for u in state.groups[name].upstream if u in state.groups and u not in seen]
            depth[name] = 1 + max((depth_of(u, seen | {name}) for u in ups), default=-1)
        return depth[name]

    rows: dict[int, int] = {}
    boxes = []
    for name, group in state.groups.items():
        column = depth_of(name)
        row = rows.get(column, 0)
        rows[column] = row + 1
        tasks = [(t, state.tasks[t].status.value, state.tasks[t].lead) for t in group.tasks]
        boxes.append(DagBox(name, group.status.value, column, row, tasks, sorted(group.upstream)))
    return boxes


# --------------------------------------------------------------------------- timeline


@dataclass(frozen=True)
class Phase:
    """One stretch of an attempt: ``kind`` is QUEUED, INITIALIZING or RUNNING."""

    kind: str
    start_s: float
    end_s: float


@dataclass
class AttemptBar:
    """One attempt of one task on the Gantt chart."""

    task: str
    retry_id: int
    status: str
    exit_code: int | None
    node: str | None
    reason: str = ""
    phases: list[Phase] = field(default_factory=list)
    ended_s: float | None = None
    """When the attempt ended (the store's end time, else its runner's exit); None while it
    runs."""


_AttemptRow = tuple[int, str, int | None, str | None, float | None, str | None]


def _attempts(ts: m.TaskState) -> list[_AttemptRow]:
    """(retry_id, status, exit_code, node, end_time_s, failure_reason) of every attempt,
    oldest first."""
    rows = [(a.retry_id, a.status.value, a.exit_code, a.node, a.end_time_s, a.failure_reason)
            for a in ts.history]
    rows.append((ts.retry_id, ts.status.value, ts.exit_code, ts.node, ts.end_time_s,
                 ts.failure_reason))
    return rows


def _bar(task: str, attempt: _AttemptRow, queued_s: float, run_dir: Path,
         now_s: float) -> AttemptBar:
    """The attempt's bar; its reason is the store's (as every view says it, e.g. "Lead task
    finished"), else its runner's exit message."""
    retry_id, status, exit_code, node, end_s, reason = attempt
    bar = AttemptBar(task, retry_id, status, exit_code, node, reason or "")
    marks = {"QUEUED": queued_s}
    for event in read_events(run_dir / EVENTS)[0]:
        if event.kind in ("INITIALIZING", "RUNNING"):
            marks.setdefault(event.kind, event.time_s)
        elif event.kind == "EXITED":
            end_s = end_s or event.time_s
            bar.reason = bar.reason or event.message
    bar.ended_s = end_s
    finish = end_s if end_s is not None else now_s
    kinds = [k for k in ("QUEUED", "INITIALIZING", "RUNNING") if k in marks]
    for kind, after in zip(kinds, kinds[1:] + [None]):
        stop = marks[after] if after else finish
        bar.phases.append(Phase(kind, marks[kind], max(stop, marks[kind])))
    return bar


def timeline(state: m.WorkflowState, run_dir: RunDir, now_s: float) -> list[AttemptBar]:
    """Every attempt of every task: queued from the submit time (a retry: from the previous
    attempt's end), then the runner's INITIALIZING and RUNNING times, until its end (or
    ``now_s`` while it runs). Attempts that never started show only QUEUED."""
    bars = []
    for name, ts in state.tasks.items():
        queued_s = state.submit_time_s or now_s
        for attempt in _attempts(ts):
            bar = _bar(name, attempt, queued_s, run_dir(name, attempt[0]), now_s)
            bars.append(bar)
            queued_s = attempt[4] or queued_s
    return bars


# --------------------------------------------------------------------------- metrics


def metrics_files(output_dir: Path, max_depth: int = 3) -> list[Path]:
    """``metrics.jsonl`` files under ``output_dir``, at most ``max_depth`` folders deep
    (the trainer writes ``{{output}}/models/metrics.jsonl`` beside its snapshot), sorted."""
    found: list[Path] = []
    for depth in range(max_depth + 1):
        found += output_dir.glob("/".join(["*"] * depth + [METRICS_FILE]))
    return sorted(p for p in found if p.is_file() and not p.is_symlink())


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Series ``{metric: [(x, value)]}`` of one metrics file.

    A line is used when it is a JSON object with a numeric ``epoch`` or ``step`` (x) and
    either no ``event`` or ``"event": "epoch"``; every other numeric field is a metric
    (booleans and ``total_epochs``/``time`` are not). Other lines are skipped.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-MAX_METRIC_ROWS:]
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or row.get("event", "epoch") != "epoch":
            continue
        x = row.get("epoch", row.get("step"))
        if not _number(x):
            continue
        for key, value in row.items():
            if key not in _SKIP_FIELDS and _number(value):
                series.setdefault(str(key)[:100], []).append((float(x), float(value)))
    return series


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curves(state: m.WorkflowState, run_dir: RunDir, label: str = "") -> list[dict[str, Any]]:
    """The runs of a workflow that wrote metrics: ``[{"run": "LABEL task/retry", "file",
    "series": {metric: [[x, y]]}}]``, one per metrics file of each attempt's output."""
    runs = []
    for name, ts in state.tasks.items():
        for retry_id in range(ts.retry_id + 1):
            output = run_dir(name, retry_id) / "output"
            for path in metrics_files(output):
                series = read_metrics(path)
                if series:
                    run = f"{label} {name}/{retry_id}".strip()
                    runs.append({"run": run, "file": str(path.relative_to(output)),
                                 "series": {k: [list(p) for p in v] for k, v in series.items()}})
    return runs


def usage(state: m.WorkflowState, run_dir: RunDir) -> list[dict[str, Any]]:
    """Samples of every attempt: ``[{"task", "retry_id", "samples": [...]}]`` (see
    ``trainyard.runner.usage``), attempts without samples left out."""
    found = []
    for name, ts in state.tasks.items():
        for retry_id in range(ts.retry_id + 1):
            samples = read_usage(run_dir(name, retry_id))
            if samples:
                found.append({"task": name, "retry_id": retry_id, "samples": samples})
    return found


def usage_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per attempt: sample count, mean and peak CPU percent, peak RSS bytes, peak GPU
    utilisation percent and memory bytes (None without GPU samples), last sample time."""
    table = []
    for attempt in rows:
        samples = attempt["samples"]
        cpus = [s.get("cpu_percent", 0.0) for s in samples]
        gpus = [g for s in samples for g in s.get("gpus", [])]
        table.append({
            "task": attempt["task"], "retry_id": attempt["retry_id"], "samples": len(samples),
            "cpu_mean_percent": round(sum(cpus) / len(cpus), 1),
            "cpu_peak_percent": max(cpus),
            "rss_peak_bytes": max(s.get("rss_bytes", 0) for s in samples),
            "gpu_peak_percent": max((g.get("util_percent", 0) for g in gpus), default=None),
            "gpu_memory_peak_bytes": max((g.get("memory_used_bytes", 0) for g in gpus),
                                         default=None),
            "last_time_s": samples[-1]["time_s"],
        })
    return table
