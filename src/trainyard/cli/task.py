"""``trainyard task list``: tasks of workflows, with OSMO's ``task list`` filters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, short_time, table

if TYPE_CHECKING:
    from trainyard.server.answers import TaskRowAnswer

__all__ = ["app", "ACTIVE"]

app = typer.Typer(no_args_is_help=True, help="Tasks of workflows.")

ACTIVE = ("PROCESSING", "SCHEDULING", "INITIALIZING", "RUNNING")
"""OSMO's default ``--status`` of ``task list``: the tasks that are starting or running."""


def _params(
    workflow_id: str | None,
    status: list[str],
    user: list[str],
    all_users: bool,
    pool: list[str],
    node: list[str],
    started_after: str | None,
    started_before: str | None,
    count: int,
    offset: int,
    priority: list[str],
) -> dict[str, Any]:
    from trainyard.cli.workflow_ops import checked_priority
    from trainyard.cli.workflow_query import _iso_time_s

    if user and all_users:
        raise typer.BadParameter("give --user or --all-users, not both", param_hint="'--all-users'")
    params: dict[str, Any] = {
        "osmo": True,
        "count": count,
        "offset": offset,
        "status": [s.upper() for s in status],
        "user": user,
        "all_users": all_users,
        "pool": pool,
        "node": node,
        "priority": [checked_priority(p) for p in priority],
        "started_after_s": _iso_time_s(started_after, "--started-after"),
        "started_before_s": _iso_time_s(started_before, "--started-before"),
    }
    if workflow_id:
        params["workflow"] = workflow_id
    return {k: v for k, v in params.items() if v is not None}


def _summary(rows: list[TaskRowAnswer], by_workflow: bool) -> list[dict[str, Any]]:
    """OSMO's ``-S`` (tasks per user and pool) or ``-W`` (per workflow): counts."""
    keys = ("user", "workflow", "pool", "priority") if by_workflow else ("user", "pool", "priority")
    counts = Counter(tuple(cast(Mapping[str, Any], row).get(k) for k in keys) for row in rows)
    return [
        {**dict(zip(keys, key, strict=True)), "tasks": n}
        for key, n in sorted(counts.items(), key=str)
    ]


@app.command("list")
def list_tasks(
    workflow_id: str | None = typer.Argument(
        None, metavar="[WORKFLOW_ID]", help="Only this workflow's tasks (or -w)."
    ),
    workflow_opt: str | None = typer.Option(
        None, "--workflow-id", "-w", help="Only this workflow's tasks."
    ),
    status: list[str] | None = typer.Option(
        None,
        "--status",
        "-s",
        metavar="STATUS",
        help="Only tasks with these statuses; "
        "several may follow one flag (osmo's default: PROCESSING SCHEDULING INITIALIZING "
        "RUNNING; trainyard's: every status).",
    ),
    user: list[str] | None = typer.Option(
        None, "--user", "-u", help="Only these users' tasks (another user's: admins only)."
    ),
    all_users: bool = typer.Option(False, "--all-users", "-a", help="Every user's tasks."),
    pool: list[str] | None = typer.Option(None, "--pool", "-p", help="Only these pools."),
    node: list[str] | None = typer.Option(
        None, "--node", "-n", help="Only tasks that ran on these nodes."
    ),
    started_after: str | None = typer.Option(
        None, "--started-after", metavar="ISO_DATE", help="Only tasks started at or after this."
    ),
    started_before: str | None = typer.Option(
        None, "--started-before", metavar="ISO_DATE", help="Only tasks started before this."
    ),
    count: int = typer.Option(20, "--count", "-c", min=1, max=1000, help="At most this many."),
    offset: int = typer.Option(0, "--offset", "-f", min=0, help="Skip this many first."),
    order: str | None = typer.Option(
        None,
        "--order",
        "-o",
        help="asc: latest at the "
        "bottom; desc: at the top (osmo's default: asc; "
        "trainyard's: desc).",
    ),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Also the retry, exit code and end time."
    ),
    summary: bool = typer.Option(False, "--summary", "-S", help="Count tasks per user and pool."),
    by_workflow: bool = typer.Option(
        False, "--aggregate-by-workflow", "-W", help="Count tasks per workflow."
    ),
    priority: list[str] | None = typer.Option(
        None,
        "--priority",
        metavar="HIGH|NORMAL|LOW",
        help="Only tasks of workflows of these priorities.",
    ),
    fmt: Format = FormatOption,
) -> None:
    """List tasks with status, node, retry and exit code, newest workflow first. JSON: a
    list of {"workflow", "group", "name", "status", "lead", "retry_id", "exit_code", "node",
    "start_time", "end_time", "failure_reason", "pool", "user", "priority"}; with -S or -W
    a list of counts."""
    from trainyard.cli.progname import by_program

    order = order or by_program("asc", "desc")
    if order not in ("asc", "desc"):
        raise typer.BadParameter(f"{order!r} is not one of 'asc', 'desc'", param_hint="'--order'")
    if workflow_id and workflow_opt and workflow_id != workflow_opt:
        raise typer.BadParameter(
            "WORKFLOW_ID and --workflow-id disagree", param_hint="'--workflow-id'"
        )
    statuses = list(status or by_program(list(ACTIVE), []))
    rows: list[TaskRowAnswer] = Client().json(
        "GET",
        "/api/task",
        params=_params(
            workflow_id or workflow_opt,
            statuses,
            list(user or []),
            all_users,
            list(pool or []),
            list(node or []),
            started_after,
            started_before,
            count,
            offset,
            list(priority or []),
        ),
    )
    if order == "asc":
        rows.reverse()  # newest workflow at the bottom
    if summary or by_workflow:
        counted = _summary(rows, by_workflow)
        emit(
            counted,
            fmt,
            lambda data: table(
                list(data[0]) if data else ["tasks"], [list(r.values()) for r in data]
            ),
        )
        return
    columns = ["workflow", "task", "status", "user", "pool", "node", "start"]
    extra = ["retry", "exit", "end"] if verbose else []
    emit(
        rows,
        fmt,
        lambda data: table(
            columns + extra,
            [
                [
                    t["workflow"],
                    t["name"],
                    t["status"],
                    t.get("user"),
                    t.get("pool"),
                    t["node"] or "-",
                    short_time(t["start_time"]),
                ]
                + ([t["retry_id"], t["exit_code"], short_time(t["end_time"])] if verbose else [])
                for t in data
            ],
        ),
    )
