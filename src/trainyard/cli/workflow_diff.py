"""``trainyard workflow diff A B``: two workflows side by side, for people or as JSON.

It asks the server's ``GET /api/workflow/A/diff/B`` (``trainyard.server.compare``): the
settings that differ (template values, labels, pool, backend, images), the final metrics of
each ``metrics.jsonl`` side by side, and whether the models the tasks saved are identical
tensor by tensor. ``-t json`` (``--format-type json``; ``--format json`` is the same) prints
the server's answer as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, emit, table

if TYPE_CHECKING:
    from trainyard.server.answers import DiffAnswer

__all__ = ["register", "diff", "FormatTypeOption"]

FormatTypeOption = typer.Option(
    Format.table,
    "--format-type",
    "-t",
    "--format",
    help="table for people, json for scripts (--format: the same)",
)

_VERDICT = {True: "identical", False: "differ", None: "not compared"}


def diff(
    workflow_a: Annotated[str, typer.Argument(help="First workflow ID.")],
    workflow_b: Annotated[str, typer.Argument(help="Second workflow ID.")],
    fmt: Format = FormatTypeOption,
) -> None:
    """Compare two workflows: the --set values, labels, pool, backend and images that differ;
    the final metrics side by side; whether their output models (*.pth, *.pt in the tasks'
    output folders, paired by task and path) are identical, tensor by tensor (not by file
    bytes). `-t json` gives {"a", "b", "differences", "metrics", "models",
    "models_identical"}."""
    data: DiffAnswer = Client().json("GET", f"/api/workflow/{workflow_a}/diff/{workflow_b}")
    emit(data, fmt, _tables)


def _shown(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _tables(data: DiffAnswer) -> None:
    a, b = data["a"], data["b"]
    rows = [["pool / backend", f"{a['pool']} / {a['backend']}", f"{b['pool']} / {b['backend']}"]]
    rows += [
        [r["field"], _shown(r["a"]), _shown(r["b"])]
        for r in data["differences"]
        if r["field"] not in ("pool", "backend")
    ]  # the first row shows both
    table(
        ["setting", a["id"], b["id"]],
        rows,
        title="where they ran, and every other setting that differs",
    )
    _models(data)
    metrics = [
        [r["file"], r["name"], _shown(r["a"]), _shown(r["b"]), "" if r["same"] else "*"]
        for r in data["metrics"]
    ]
    if metrics:
        table(["file", "metric", a["id"], b["id"], "differs"], metrics, title="final metrics")
    typer.echo(f"models: {_VERDICT[data['models_identical']]}")


def _models(data: DiffAnswer) -> None:
    if not data["models"]:
        typer.echo("no model files (*.pth, *.pt) in the tasks' output folders")
        return
    rows = [
        [
            r["file"],
            _VERDICT[r["identical"]] + (f" ({r['error']})" if r.get("error") else ""),
            r.get("tensors", "-"),
            ", ".join(r.get("differing") or []) or "-",
            {True: "yes", False: "no", None: "-"}[r.get("same_bytes")],
        ]
        for r in data["models"]
    ]
    table(
        ["model file", "verdict", "tensors", "differing", "same bytes"], rows, title="output models"
    )


def register(app: typer.Typer) -> None:
    """Add ``diff`` to the ``workflow`` sub-app."""
    app.command("diff")(diff)
