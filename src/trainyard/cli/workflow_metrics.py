"""``trainyard workflow metrics ID``: what the dashboard plots, as tables or JSON.

It asks the server's ``GET /api/workflow/ID/metrics`` (``trainyard.server.web``): the
utilisation the runner sampled per task attempt (``usage.jsonl``, see
``trainyard.runner.usage``) and the training curves of every ``metrics.jsonl`` under a task's
output folder (docs/dashboard.md).
"""

from __future__ import annotations

from datetime import UTC
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, human_bytes, short_time, table

if TYPE_CHECKING:
    from trainyard.server.answers import MetricsAnswer

__all__ = ["register", "metrics"]

_CURVE_COLUMNS = (
    "val_loss",
    "loss",
    "val_accuracy",
    "accuracy",
    "throughput_images_per_s",
    "images_per_s",
)


def metrics(
    workflow_id: Annotated[str, typer.Argument(help="Workflow ID.")], fmt: Format = FormatOption
) -> None:
    """Per task attempt: CPU (mean, peak; 100% = one core), peak memory and GPU use sampled by
    the runner every 2 s; then each run's training curve (epochs, last values). ``-t json``
    gives every sample and every point."""
    data: MetricsAnswer = Client().json("GET", f"/api/workflow/{workflow_id}/metrics")
    emit(data, fmt, _tables)


def _tables(data: MetricsAnswer) -> None:
    usage = [
        [
            r["task"],
            r["retry_id"],
            r["samples"],
            f"{r['cpu_mean_percent']:.0f}%",
            f"{r['cpu_peak_percent']:.0f}%",
            human_bytes(r["rss_peak_bytes"]),
            "-" if r["gpu_peak_percent"] is None else f"{r['gpu_peak_percent']}%",
            "-" if r["gpu_memory_peak_bytes"] is None else human_bytes(r["gpu_memory_peak_bytes"]),
        ]
        for r in data["summary"]
    ]
    table(
        [
            "task",
            "retry",
            "samples",
            "cpu mean",
            "cpu peak",
            "mem peak",
            "gpu peak",
            "gpu mem peak",
        ],
        usage,
        title=f"utilisation of {data['id']} ({data['status']})",
    )
    if not data["curves"]:
        typer.echo("no training curves (no metrics.jsonl under a task's output folder)")
        return
    shown = [c for c in _CURVE_COLUMNS if any(c in run["series"] for run in data["curves"])]
    rows = [
        [run["run"], run["file"], _last_x(run)] + [_last(run, name) for name in shown]
        for run in data["curves"]
    ]
    table(["run", "file", "reached", *shown], rows, title="training curves (last values)")


def _last_x(run: dict[str, Any]) -> str:
    """How far a run got on its own x axis (docs/dashboard.md): ``epoch 3``, ``step 400``,
    or the time of its last row (UTC, the one format)."""
    xs = {point[0] for points in run["series"].values() for point in points}
    if not xs:
        return "-"
    x_name = run.get("x", "epoch")
    if x_name == "time":
        from datetime import datetime

        return short_time(datetime.fromtimestamp(max(xs), tz=UTC).isoformat())
    return f"{x_name} {max(xs):g}"


def _last(run: dict[str, Any], name: str) -> str:
    points = run["series"].get(name)
    if not points:
        return "-"
    value = points[-1][1]
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def register(app: typer.Typer) -> None:
    """Add ``metrics`` to the ``workflow`` sub-app."""
    app.command("metrics")(metrics)
