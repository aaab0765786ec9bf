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
import math
import os
import stat
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

from trainyard.engine import machine as m
from trainyard.runner.report import EVENTS, read_events
from trainyard.runner.usage import read_usage

__all__ = [
    "DagBox",
    "dag_layout",
    "Phase",
    "AttemptBar",
    "timeline",
    "metrics_files",
    "find_files",
    "read_metrics",
    "read_curves",
    "read_curves_and_times",
    "X_AXES",
    "curves",
    "usage",
    "usage_summary",
    "RunDir",
    "METRICS_FILE",
    "MAX_POINTS",
    "MAX_SERIES",
    "METRICS_READ_BYTES",
    "MAX_SCAN_ENTRIES",
]

METRICS_FILE = "metrics.jsonl"
MAX_POINTS = 500
"""A chart's points per metric: a series keeps between this and twice this many."""
MAX_SERIES = 32
"""Metrics kept per file (the first ones seen); a writer inventing names gets no more."""
METRICS_READ_BYTES = 8 << 20
"""The most one call reads of one metrics file (its newest part)."""
MAX_METRIC_LINE_BYTES = 64 << 10
"""A longer line is skipped without being held."""
MAX_CACHED_FILES = 128
"""Metrics files whose series are kept between calls (the least recently read go first)."""
_SKIP_FIELDS = {"epoch", "step", "time", "event", "total_epochs", "snapshot_saved", "injected"}
X_AXES = ("step", "epoch", "time")
"""What a metrics file's x axis may be, in the order its first usable row is asked:
``step`` (a number), ``epoch`` (a number), ``time`` (Unix seconds or an ISO 8601 time)."""

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
    rows = [
        (a.retry_id, a.status.value, a.exit_code, a.node, a.end_time_s, a.failure_reason)
        for a in ts.history
    ]
    rows.append(
        (ts.retry_id, ts.status.value, ts.exit_code, ts.node, ts.end_time_s, ts.failure_reason)
    )
    return rows


def _bar(
    task: str, attempt: _AttemptRow, queued_s: float, run_dir: Path, now_s: float
) -> AttemptBar:
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
    for kind, after in zip(kinds, kinds[1:] + [None], strict=True):
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


MAX_SCAN_ENTRIES = 20_000
"""Folder entries one search of a task's output looks at, at most (a task can make a
million folders, and the search runs on every poll of the workflow page)."""
MAX_FOUND_FILES = 64
"""Files one search returns, at most."""


def find_files(
    root: Path,
    accept: Callable[[str], bool],
    *,
    max_depth: int = 3,
    max_entries: int | None = None,
    max_found: int = MAX_FOUND_FILES,
) -> list[Path]:
    """Regular files under ``root`` whose name ``accept`` takes, at most ``max_depth``
    folders deep, sorted; links (to files or folders) are never followed.

    Bounded whatever the task made: folders are visited breadth first (shallow files are
    found first) and the search stops after ``max_entries`` entries (None:
    ``MAX_SCAN_ENTRIES``) or ``max_found`` files.
    """
    limit = MAX_SCAN_ENTRIES if max_entries is None else max_entries
    found: list[Path] = []
    level, seen = [root], 0
    for _depth in range(max_depth + 1):
        below: list[Path] = []
        for folder in level:
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        seen += 1
                        if seen > limit:
                            return sorted(found)
                        if entry.is_dir(follow_symlinks=False):
                            below.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False) and accept(entry.name):
                            found.append(Path(entry.path))
                            if len(found) >= max_found:
                                return sorted(found)
            except OSError:
                continue
        level = below
    return sorted(found)


def metrics_files(output_dir: Path, max_depth: int = 3) -> list[Path]:
    """``metrics.jsonl`` files under ``output_dir``, at most ``max_depth`` folders deep
    (the trainer writes ``{{output}}/models/metrics.jsonl`` beside its snapshot), sorted;
    bounded as ``find_files``."""
    return find_files(output_dir, lambda name: name == METRICS_FILE, max_depth=max_depth)


@dataclass
class _Series:
    """One metric's points, thinned to at most ``2 * MAX_POINTS``: every ``stride``-th point
    is kept (the stride doubles whenever the kept points reach that), and the latest point
    always (``last``), so a chart shows the whole run and its newest value. Beside each
    point, the time of its row (Unix seconds; NaN where the row has none)."""

    xs: array = field(default_factory=lambda: array("d"))
    ys: array = field(default_factory=lambda: array("d"))
    ts: array = field(default_factory=lambda: array("d"))
    stride: int = 1
    seen: int = 0
    last: tuple[float, float, float] | None = None

    def add(self, x: float, y: float, t: float = math.nan) -> None:
        if self.seen % self.stride == 0:
            self.xs.append(x)
            self.ys.append(y)
            self.ts.append(t)
            if len(self.xs) >= 2 * MAX_POINTS:
                self.xs, self.ys, self.ts = self.xs[::2], self.ys[::2], self.ts[::2]
                self.stride *= 2
        self.seen += 1
        self.last = (x, y, t)

    def _kept(self) -> list[tuple[float, float, float]]:
        kept = list(zip(self.xs, self.ys, self.ts, strict=True))
        if self.last is not None and (not kept or kept[-1][:2] != self.last[:2]):
            kept.append(self.last)
        return kept

    def points(self) -> list[tuple[float, float]]:
        return [(x, y) for x, y, _ in self._kept()]

    def times(self) -> list[float | None]:
        """The time of each of ``points()`` (Unix seconds), None where its row had none."""
        return [None if math.isnan(t) else t for _, _, t in self._kept()]


@dataclass
class _FileCurves:
    """What was read of one metrics file: up to ``offset`` (a line's start), as series."""

    ino: int
    offset: int = 0
    x_name: str | None = None
    """The file's x axis (one of ``X_AXES``), set by its first usable row."""
    series: dict[str, _Series] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_CACHE: OrderedDict[str, _FileCurves] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def _cached(path: Path, ino: int) -> _FileCurves:
    """The cache entry of ``path`` (a new one when the file was replaced), most recent last;
    the least recently used beyond ``MAX_CACHED_FILES`` are forgotten."""
    key = str(path)
    with _CACHE_LOCK:
        entry = _CACHE.get(key)
        if entry is None or entry.ino != ino:
            entry = _CACHE[key] = _FileCurves(ino)
        _CACHE.move_to_end(key)
        while len(_CACHE) > MAX_CACHED_FILES:
            _CACHE.popitem(last=False)
        return entry


def read_metrics(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Series ``{metric: [(x, value)]}`` of one metrics file, each at most about
    ``2 * MAX_POINTS`` points (thinned evenly, the latest point kept), at most
    ``MAX_SERIES`` metrics.

    A line is used when it is a JSON object with a numeric ``epoch`` or ``step`` (x) and
    either no ``event`` or ``"event": "epoch"``; every other numeric field is a metric
    (booleans and ``total_epochs``/``time`` are not). Other lines are skipped, and so are
    lines over ``MAX_METRIC_LINE_BYTES``.

    Bounded in time and memory whatever the file's size: what was read is cached by file (path
    and inode) with the offset it reached; a call reads only what the file gained since, at most
    ``METRICS_READ_BYTES`` (a file that grew more is read from that far before its end: the
    older part is skipped, as the last rows matter most). A file shorter than the offset, or
    another file at the path, is read again from its start. Not a regular file (a FIFO, a link):
    no series.
    """
    return read_curves(path)[1]


def read_curves(path: Path) -> tuple[str, dict[str, list[tuple[float, float]]]]:
    """The x axis of one metrics file and its series: ``(x_name, {metric: [(x, value)]})``,
    as :func:`read_metrics` reads them.

    The x axis is the data's, chosen by the file's first usable row (docs/dashboard.md):
    ``step`` when it has a numeric ``step``, else ``epoch`` when it has a numeric
    ``epoch``, else ``time`` when it has a ``time`` (Unix seconds, or an ISO 8601 time with
    a zone, read as UTC without one); later rows without that field are skipped. A file
    without a usable row answers ``("step", {})``.
    """
    x_name, series, _times = read_curves_and_times(path)
    return x_name, series


def read_curves_and_times(
    path: Path,
) -> tuple[str, dict[str, list[tuple[float, float]]], dict[str, list[float | None]]]:
    """:func:`read_curves`, and the time of each point's row by metric (Unix seconds, None
    where the row had no ``time``): the dashboard's other x axis. The times are empty when
    the x axis is ``time`` itself or no row has one."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return X_AXES[0], {}, {}
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return X_AXES[0], {}, {}
        entry = _cached(path, st.st_ino)
        with entry.lock:
            if st.st_size < entry.offset:
                entry.offset, entry.series, entry.x_name = 0, {}, None
            _read_new(handle, entry, st.st_size)
            series = {k: v.points() for k, v in entry.series.items()}
            times = (
                {} if entry.x_name == "time" else {k: v.times() for k, v in entry.series.items()}
            )
            x_name = entry.x_name or X_AXES[0]
    if not any(t is not None for ts in times.values() for t in ts):
        times = {}
    return x_name, series, times


def _read_new(handle: BinaryIO, entry: _FileCurves, size: int) -> None:
    """Add the complete lines between ``entry.offset`` and ``size`` (the last
    ``METRICS_READ_BYTES`` of them) to ``entry``; a last line without newline waits."""
    if size - entry.offset > METRICS_READ_BYTES:
        start = size - METRICS_READ_BYTES
        handle.seek(start)
        handle.readline(MAX_METRIC_LINE_BYTES)  # the rest of a line cut in two
        entry.offset = handle.tell()
    handle.seek(entry.offset)
    while entry.offset < size:
        raw = handle.readline(min(MAX_METRIC_LINE_BYTES, size - entry.offset))
        if not raw.endswith(b"\n") and len(raw) < MAX_METRIC_LINE_BYTES:
            return  # a line still being written (or the file shrank): read it when complete
        entry.offset += len(raw)
        if raw.endswith(b"\n"):
            _add_row(entry, raw)
        # else: the start of a line too long to use; its rest is no JSON object either


def _add_row(entry: _FileCurves, raw: bytes) -> None:
    """The metrics of one line, if it is a metrics row (the first one sets the x axis)."""
    try:
        row = json.loads(raw)
    except ValueError:
        return
    if not isinstance(row, dict) or row.get("event", "epoch") != "epoch":
        return
    if entry.x_name is None:
        entry.x_name = next((n for n in X_AXES if _x_value(row, n) is not None), None)
        if entry.x_name is None:
            return
    x = _x_value(row, entry.x_name)
    if x is None:
        return
    t = _x_value(row, "time") if entry.x_name != "time" else None
    series = entry.series
    for key, value in row.items():
        if key in _SKIP_FIELDS or not _number(value):
            continue
        name = str(key)[:100]
        if name not in series and len(series) >= MAX_SERIES:
            continue
        series.setdefault(name, _Series()).add(x, float(value), math.nan if t is None else t)


def _x_value(row: dict[str, Any], name: str) -> float | None:
    """The row's ``name`` as an x value: a number; for ``time`` also an ISO 8601 time (Unix
    seconds; UTC when it names no zone). None when the row has none."""
    value = row.get(name)
    if _number(value):
        return float(value)
    if name == "time" and isinstance(value, str):
        from datetime import datetime

        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return None


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curves(state: m.WorkflowState, run_dir: RunDir, label: str = "") -> list[dict[str, Any]]:
    """The runs of a workflow that wrote metrics: ``[{"run": "LABEL task/retry", "file",
    "x", "series": {metric: [[x, y]]}, "times": {metric: [t]}}]``, one per metrics file of
    each attempt's output; ``x`` names the x axis (``step``, ``epoch`` or ``time`` in Unix
    seconds: see :func:`read_curves`); ``times`` gives the time of each point's row (Unix
    seconds or null; empty when the x axis is time or no row has one)."""
    runs = []
    for name, ts in state.tasks.items():
        for retry_id in range(ts.retry_id + 1):
            output = run_dir(name, retry_id) / "output"
            for path in metrics_files(output):
                x_name, series, times = read_curves_and_times(path)
                if series:
                    run = f"{label} {name}/{retry_id}".strip()
                    runs.append(
                        {
                            "run": run,
                            "file": str(path.relative_to(output)),
                            "x": x_name,
                            "series": {k: [list(p) for p in v] for k, v in series.items()},
                            "times": times,
                        }
                    )
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
        table.append(
            {
                "task": attempt["task"],
                "retry_id": attempt["retry_id"],
                "samples": len(samples),
                "cpu_mean_percent": round(sum(cpus) / len(cpus), 1),
                "cpu_peak_percent": max(cpus),
                "rss_peak_bytes": max(s.get("rss_bytes", 0) for s in samples),
                "gpu_peak_percent": max((g.get("util_percent", 0) for g in gpus), default=None),
                "gpu_memory_peak_bytes": max(
                    (g.get("memory_used_bytes", 0) for g in gpus), default=None
                ),
                "last_time_s": samples[-1]["time_s"],
            }
        )
    return table
