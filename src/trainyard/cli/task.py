"""``trainyard task list``: the tasks of a workflow, or of your latest workflows."""

from __future__ import annotations

from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, short_time, table

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Tasks of workflows.")


@app.command("list")
def list_tasks(
    workflow_id: Optional[str] = typer.Argument(
        None, metavar="[WORKFLOW_ID]", help="Only this workflow's tasks (default: the tasks "
        "of your latest --count workflows; an admin's: everyone's)."),
    count: int = typer.Option(20, "--count", "-c", min=1,
                              help="Without WORKFLOW_ID: of this many latest workflows."),
    fmt: Format = FormatOption,
) -> None:
    """List tasks with status, node, retry and exit code. JSON: a list of {"workflow",
    "group", "name", "status", "lead", "retry_id", "exit_code", "node", "start_time",
    "end_time", "failure_reason"}."""
    params: dict[str, object] = {"count": count}
    if workflow_id:
        params["workflow"] = workflow_id
    data = Client().json("GET", "/api/task", params=params)
    emit(data, fmt, lambda rows: table(
        ["workflow", "task", "status", "node", "retry", "exit", "start"],
        [[t["workflow"], t["name"], t["status"], t["node"] or "-", t["retry_id"],
          t["exit_code"], short_time(t["start_time"])] for t in rows]))
