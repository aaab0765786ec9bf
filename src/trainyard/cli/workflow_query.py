"""``trainyard workflow query|events|list|logs``: what the server knows of workflows.

With ``--format json`` stdout holds one JSON document (for ``logs``, JSON Lines). Errors are
raised, never printed here (``cli.main`` prints them and exits with their code).
"""

from __future__ import annotations

from datetime import UTC
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (
    Format,
    FormatOption,
    LongFormatOption,
    console,
    emit,
    err_console,
    short_time,
    table,
)
from trainyard.cli.workflow_ops import (
    _STATUS_HELP,
    STATUSES,
    WorkflowIdArg,
    _flat,
    _inside,
    checked_priority,
    print_log_tail,
    print_waiting,
)
from trainyard.errors import NotFoundError

if TYPE_CHECKING:
    from trainyard.server.answers import (
        EventAnswer,
        WorkflowAnswer,
        WorkflowSummary,
    )


__all__ = ["register", "query", "events", "list_workflows", "logs"]


def _query_table(data: WorkflowAnswer) -> None:
    console.print(
        f"Workflow {data['id']} ({data['name']}): {data['status']}, "
        f"submitted by {data['submitted_by']} at {short_time(data['submit_time'])} UTC",
        markup=False,
        highlight=False,
    )
    if data.get("labels"):
        console.print(
            "Labels: " + ", ".join(f"{k}={v}" for k, v in sorted(data["labels"].items())),
            markup=False,
        )
    rows = []
    for group in data["groups"]:
        for t in group["tasks"]:
            rows.append(
                [
                    group["name"],
                    t["name"] + (" (lead)" if t["lead"] else ""),
                    t["status"],
                    t["retry_id"],
                    t["exit_code"],
                    t["node"],
                    short_time(t["start_time"], date=False),
                    short_time(t["end_time"], date=False),
                ]
            )
            for r in t.get("retries", []):
                rows.append(
                    [
                        "",
                        f"  retry {r['retry_id']}",
                        r["status"],
                        r["retry_id"],
                        r["exit_code"],
                        r["node"],
                        short_time(r["start_time"], date=False),
                        short_time(r["end_time"], date=False),
                    ]
                )
    table(["group", "task", "status", "retry", "exit", "node", "start UTC", "end UTC"], rows)
    failure = data.get("failure")
    if failure:
        code = (
            f" (exit code {failure['exit_code']})" if failure.get("exit_code") is not None else ""
        )
        console.print(
            f"Failed: task {failure['task']} retry {failure['retry_id']} "
            f"{failure['status']}{code}: {failure['reason']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        print_log_tail(console, failure.get("log_tail") or [])
        console.print(
            f"  its log: trainyard workflow logs {data['id']} --task "
            f"{failure['task']} --retry-id {failure['retry_id']}",
            markup=False,
            highlight=False,
        )
    print_waiting(console, data, prefix="Waiting: ")
    _print_isolation(data)
    for group in data["groups"]:
        for t in group["tasks"]:
            for attempt in [*t.get("retries", []), t]:
                same = (
                    failure
                    and failure["task"] == t["name"]
                    and failure["retry_id"] == attempt["retry_id"]
                )
                if attempt.get("failure_reason") and not same:  # a stopped, COMPLETED task's too
                    ended = "ended" if attempt.get("status") == "COMPLETED" else "failed"
                    console.print(
                        f"{t['name']} retry {attempt['retry_id']} {ended}: "
                        f"{attempt['failure_reason']}",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )


def _print_isolation(data: WorkflowAnswer) -> None:
    """Each task's isolation detail (a verbose query's ``isolation``), under its name."""
    for group in data["groups"]:
        for t in group["tasks"]:
            if t.get("isolation"):
                console.print(f"Isolation of {t['name']} retry {t['retry_id']}:", markup=False)
                for line in t["isolation"]:
                    console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


def query(
    workflow_id: str = WorkflowIdArg,
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="list every retry, and how each task is isolated (sandbox, network, image)",
    ),
    fmt: Format = FormatOption,
) -> None:
    """Show a workflow's groups and tasks.

    With --verbose, JSON adds each task's "isolation": the detail lines of its current
    attempt's log header (``[task][detail]``), [] before its runner started."""
    params = {"verbose": True, "isolation": True} if verbose else {"verbose": False}
    data: WorkflowAnswer = Client().json("GET", f"/api/workflow/{workflow_id}", params=params)
    emit(data, fmt, _query_table)


def _events_of(
    rows: list[EventAnswer], task: str | None, retry_id: int | None
) -> list[EventAnswer]:
    """OSMO's ``events --task --retry-id``: the events of one task, of ``retry_id`` or
    else of its latest attempt; every event without ``task``."""
    if task is None:
        return rows
    mine = [e for e in rows if e["task"] == task]
    if retry_id is None and mine:
        retry_id = max(e["retry_id"] for e in mine)
    return [e for e in mine if e["retry_id"] == retry_id]


def events(
    workflow_id: str = WorkflowIdArg,
    task: str | None = typer.Option(None, "--task", "-t", help="Only this task."),
    retry_id: int | None = typer.Option(
        None, "--retry-id", "-r", min=0, help="With --task: this attempt (default: its latest)."
    ),
    fmt: Format = LongFormatOption,
) -> None:
    """Show every transition of each task attempt, oldest first: the runner's INITIALIZING,
    RUNNING and EXITED (with its exit code) from the attempt's events.jsonl, then the
    status it ended with (COMPLETED, RESCHEDULED, FAILED*, with the failure reason). JSON:
    a list of {"time" (ISO 8601 UTC), "task", "retry_id", "event", "exit_code", "message"}.
    As in OSMO, -t is --task here: the format is --format-type."""
    if retry_id is not None and task is None:
        raise typer.BadParameter("--retry-id goes with --task", param_hint="'--retry-id'")
    rows: list[EventAnswer] = Client().json("GET", f"/api/workflow/{workflow_id}/events")
    data = _events_of(rows, task, retry_id)
    if task is not None and not data and not any(e["task"] == task for e in rows):
        raise NotFoundError(f"workflow {workflow_id} has no task {task!r} with events")
    emit(
        data,
        fmt,
        lambda rows: table(
            ["time", "task", "retry", "event", "exit", "message"],
            [
                [
                    short_time(e["time"]),
                    e["task"],
                    e["retry_id"],
                    e["event"],
                    e["exit_code"],
                    e["message"],
                ]
                for e in rows
            ],
        ),
    )


def _statuses(values: list[str] | None) -> list[str]:
    """``--status`` values, upper-cased; a usage error (exit 2) names the valid ones."""
    wanted = [v.upper() for v in values or []]
    unknown = [v for v, w in zip(values or [], wanted, strict=True) if w not in STATUSES]
    if unknown:
        raise typer.BadParameter(
            f"unknown workflow status {', '.join(map(repr, unknown))}; "
            f"statuses: {', '.join(STATUSES)}"
        )
    return wanted


def _iso_time_s(value: str | None, option: str) -> float | None:
    """An ISO 8601 date or time (``2026-01-31``, ``2026-01-31T12:00``, with or without an
    offset; without one: UTC) as Unix seconds; a usage error (exit 2) otherwise."""
    if value is None:
        return None
    from datetime import datetime

    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is no ISO 8601 date or time; give e.g. 2026-01-31 or 2026-01-31T12:00:00Z",
            param_hint=option,
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


class Order(StrEnum):
    asc = "asc"
    desc = "desc"


def _list_params(
    status: list[str],
    name: str | None,
    label: list[str],
    user: list[str],
    all_users: bool,
    pool: list[str],
    count: int | None,
    offset: int,
    submitted_after: str | None,
    submitted_before: str | None,
) -> dict[str, Any]:
    """The server's query for ``workflow list``: always newest first (``--order`` only
    turns the page round, as OSMO's does)."""
    if user and all_users:
        raise typer.BadParameter("give --user or --all-users, not both", param_hint="'--all-users'")
    params: dict[str, Any] = {
        "status": status,
        "label": label,
        "user": user,
        "pool": pool,
        "all_users": all_users,
    }
    optional = {
        "name": name,
        "count": count,
        "submitted_after_s": _iso_time_s(submitted_after, "--submitted-after"),
        "submitted_before_s": _iso_time_s(submitted_before, "--submitted-before"),
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if offset:
        params["offset"] = offset
    return params


def list_workflows(
    status: list[str] | None = typer.Option(
        None, "--status", "-s", callback=_statuses, metavar="STATUS", help=_STATUS_HELP
    ),
    name: str | None = typer.Option(None, "--name", "-n", help="Only names containing this."),
    label: list[str] | None = typer.Option(
        None,
        "--label",
        metavar="KEY=VALUE",
        help="Only workflows with this label (all must match).",
    ),
    no_label: list[str] | None = typer.Option(
        None,
        "--no-label",
        metavar="KEY",
        help="Only workflows without this label key (repeat: every key absent).",
    ),
    user: list[str] | None = typer.Option(
        None,
        "--user",
        "-u",
        help="Only these users' workflows; several may follow one flag "
        "(another user's: admins only). Default: yours.",
    ),
    all_users: bool = typer.Option(
        False,
        "--all-users",
        "-a",
        help="Every user's workflows (those you may read: a non-admin's own).",
    ),
    pool: list[str] | None = typer.Option(
        None, "--pool", "-p", help="Only workflows of these pools; several may follow one flag."
    ),
    app_name: str | None = typer.Option(
        None,
        "--app",
        "-P",
        metavar="APP[:VERSION]",
        help="Only workflows submitted from this app (or this version of it).",
    ),
    tags: list[str] | None = typer.Option(
        None,
        "--tags",
        metavar="TAG",
        help="Only workflows holding one of these tags; several may follow one flag.",
    ),
    priority: list[str] | None = typer.Option(
        None,
        "--priority",
        metavar="HIGH|NORMAL|LOW",
        help="Only workflows of these priorities; several may follow one flag.",
    ),
    count: int | None = typer.Option(
        None,
        "--count",
        "-c",
        min=1,
        help="At most this many, the newest (osmo: default 20; trainyard: all).",
    ),
    offset: int = typer.Option(
        0, "--offset", "-f", min=0, help="Skip this many newest first (paging)."
    ),
    order: Order | None = typer.Option(
        None,
        "--order",
        "-o",
        help="How the page is shown: asc puts the latest at the bottom, "
        "desc at the top (osmo: default asc; trainyard: desc). The page itself is always the "
        "newest --count after --offset.",
    ),
    submitted_after: str | None = typer.Option(
        None,
        "--submitted-after",
        metavar="ISO_DATE",
        help="Only those submitted at or after this (2026-01-31, 2026-01-31T12:00Z; UTC "
        "without an offset).",
    ),
    submitted_before: str | None = typer.Option(
        None, "--submitted-before", metavar="ISO_DATE", help="Only those submitted before this."
    ),
    fmt: Format = FormatOption,
) -> None:
    """List your workflows (-a: everyone's), OSMO's way: the newest --count after --offset,
    shown in --order. JSON: a list of {"id", "name", "status", "pool", "submitted_by",
    "labels", "submit_time", "end_time"} (times ISO 8601 UTC), in the order shown."""
    from trainyard.cli.progname import by_program

    params = _list_params(
        status or [],
        name,
        label or [],
        _flat(user),
        all_users,
        _flat(pool),
        count if count is not None else by_program(20, None),
        offset,
        submitted_after,
        submitted_before,
    )
    extra = {
        "tag": _flat(tags),
        "priority": [checked_priority(p) for p in _flat(priority)],
        "no_label": _flat(no_label),
        "app": app_name,
    }
    params.update({k: v for k, v in extra.items() if v})
    data: list[WorkflowSummary] = Client().json("GET", "/api/workflow", params=params)
    if (order or by_program(Order.asc, Order.desc)) is Order.asc:
        data.reverse()
    emit(
        data,
        fmt,
        lambda rows: table(
            ["id", "status", "pool", "user", "submitted"],
            [
                [w["id"], w["status"], w["pool"], w["submitted_by"], short_time(w["submit_time"])]
                for w in rows
            ],
        ),
    )


def logs(
    workflow_id: str = WorkflowIdArg,
    task: str | None = typer.Option(None, "--task", "-t", help="Only this task."),
    retry_id: int | None = typer.Option(
        None, "--retry-id", "-r", min=0, help="Only this attempt (0 is the first)."
    ),
    follow: bool | None = typer.Option(
        None,
        "--follow/--no-follow",
        help="Keep printing new lines until the workflow ends "
        "(the default, as OSMO's `workflow logs`, except inside a task of that same workflow, "
        "which would wait for itself); --no-follow prints what is written now and returns.",
    ),
    error: bool = typer.Option(
        False,
        "--error",
        help="Only the logs of failed attempts "
        "(FAILED*, or RESCHEDULED: retried after a failure): the "
        "runner keeps a task's stdout and stderr in "
        "one stream, so there is no stderr of its own to show.",
    ),
    lines: int | None = typer.Option(
        None,
        "-n",
        min=1,
        help="Only the last N lines (when following: of those already written, then new ones).",
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        help="Also the runner's detail "
        "of how each task is isolated (sandbox, network, image: "
        "lines tagged [task][detail]); by default each task's log "
        "starts with one short line instead.",
    ),
    fmt: Format = LongFormatOption,
) -> None:
    r"""Print a workflow's task logs in OSMO's line format (YYYY/MM/DD HH:MM:SS \[task] text,
    UTC), whatever its status; while it runs, follow it to its end (--no-follow: don't).

    With --format json: JSON Lines, one object per log line, {"time": ISO 8601 UTC,
    "task", "retry_id", "line": the text after the time and the \[task] tag, "source":
    "runner" for trainyard's own lines (tagged \[task]\[trainyard]) or "task", "cut": true
    for a piece of a line longer than 64 KiB (tagged \[task]\[cut]) that the next line of
    the task continues}. Control characters in task output are shown escaped (a carriage
    return as \r, an escape as \x1b).
    """
    params: dict[str, Any] = {
        k: v
        for k, v in {"task": task, "retry_id": retry_id, "lines": lines}.items()
        if v is not None
    }
    if fmt is Format.json:
        params["format"] = "json"
    if error:
        params["error"] = True
    if verbose:
        params["verbose"] = True
    client, path = Client(), f"/api/workflow/{workflow_id}/logs"
    if follow if follow is not None else not _inside(workflow_id, client.token):
        params["follow"] = True
    try:
        for text in client.stream_text(path, **params):  # printed as it arrives
            typer.echo(text, nl=False)
    except KeyboardInterrupt:
        err_console.print(f"Stopped following; workflow {workflow_id} goes on.", markup=False)
        raise typer.Exit(130) from None


def register(app: typer.Typer) -> None:
    """Add ``query``, ``list``, ``logs`` and ``events`` to the ``workflow`` sub-app."""
    app.command()(query)
    app.command("list")(list_workflows)
    app.command()(logs)
    app.command()(events)
