"""``trainyard workflow cancel|restart|tag|delete|prune``: change workflows on the server.

With ``--format json`` stdout holds one JSON document. Errors are raised, never printed here
(``cli.main`` prints them and exits with their code).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (
    Format,
    FormatOption,
    console,
    emit,
    err_console,
)
from trainyard.cli.workflow_ops import WorkflowIdArg, _flat, finish_wait
from trainyard.errors import RefusedError, TrainyardError

if TYPE_CHECKING:
    from trainyard.server.answers import (
        CancelAnswer,
        DeleteAnswer,
        KeptAnswer,
        PruneAnswer,
        TagAnswer,
        WorkflowSummary,
    )


__all__ = ["register", "cancel", "restart", "tag", "delete", "prune"]


def _cancel_one(
    client: Client, workflow_id: str, message: str | None, force: bool
) -> tuple[CancelAnswer | CancelFailed, int]:
    """Cancel one workflow: (its row, its exit status: 0 cancelled, 4 it had ended, an
    error's code)."""
    params: dict[str, Any] = {"force": force} if force else {}
    if message:
        params["message"] = message
    try:
        data: CancelAnswer = client.json(
            "POST", f"/api/workflow/{workflow_id}/cancel", params=params
        )
    except TrainyardError as exc:
        return {"id": workflow_id, "error": str(exc)}, exc.exit_code
    return data, RefusedError.exit_code if data["had_ended"] else 0


class CancelFailed(TypedDict):
    """A workflow the CLI could not cancel, and why (beside the server's ``CancelAnswer``)."""

    id: str
    error: str


def _print_cancel(data: CancelAnswer | CancelFailed) -> None:
    if "error" in data:
        failed = cast("CancelFailed", data)
        err_console.print(f"error: workflow {failed['id']}: {failed['error']}", markup=False)
        return
    done = cast("CancelAnswer", data)
    if done["had_ended"]:
        err_console.print(
            f"Workflow {done['id']} had already ended: {done['status']}; nothing to cancel",
            markup=False,
        )
    else:
        console.print(f"Workflow {done['id']} cancel requested: {done['status']}", markup=False)


def cancel(
    workflow_ids: list[str] = typer.Argument(
        ..., metavar="WORKFLOW_ID...", help="The workflows to cancel (NAME-N)."
    ),
    message: str | None = typer.Option(
        None, "--message", "-m", help="Why: kept with the workflow (its cancel_message)."
    ),
    force: bool = typer.Option(
        False,
        "--force",
        "-f",
        help="OSMO's force cancel: no "
        "grace period, the tasks' processes SIGKILLed at once "
        "(no SIGTERM first: nothing of theirs runs on the way "
        "out); Slurm: scancel as usual.",
    ),
    fmt: Format = FormatOption,
) -> None:
    """Cancel workflows: stop every task; each ends FAILED_CANCELED. Each is cancelled on
    its own and its result printed. Exit 0 when every one was cancelled; otherwise the
    first problem's code: 4 when one had already ended (it is left as it ended), 3 an
    unknown id, 8 not yours. JSON: for one id its summary {"id", "status", ...,
    "had_ended"}; for several a list of them ({"id", "error"} for one that failed)."""
    client = Client()
    results = [_cancel_one(client, workflow_id, message, force) for workflow_id in workflow_ids]
    rows = [row for row, _code in results]
    if fmt is Format.json:
        emit(rows[0] if len(rows) == 1 else rows, fmt, lambda _d: None)
    else:
        for row in rows:
            _print_cancel(row)
    status = next((code for _row, code in results if code), 0)
    if status:
        raise typer.Exit(status)


def restart(
    workflow_id: str = WorkflowIdArg,
    pool: str | None = typer.Option(
        None,
        "--pool",
        "-p",
        help="OSMO's target pool: only the workflow's own pool "
        "is taken (its completed groups' outputs are there); another is refused "
        "(exit 4).",
    ),
    wait: bool = typer.Option(
        False, "--wait", help="Show progress until it ends; exit 0 only if it COMPLETED."
    ),
    fmt: Format = FormatOption,
) -> None:
    """Run a failed workflow's failed groups again, keeping its completed ones. A running
    or COMPLETED workflow is refused (exit 4)."""
    client = Client()
    data: WorkflowSummary = client.json(
        "POST", f"/api/workflow/{workflow_id}/restart", params={"pool": pool} if pool else {}
    )
    if not wait:
        emit(data, fmt, lambda d: console.print(f"Workflow {d['id']} restarted: {d['status']}"))
        return
    if fmt.human:
        console.print(f"Workflow {data['id']} restarted: {data['status']}")
    finish_wait(client, workflow_id, fmt)


def tag(
    workflows: list[str] | None = typer.Option(
        None,
        "--workflow",
        "-w",
        metavar="WORKFLOW_ID",
        help="The workflows to change; "
        "several may follow one flag. Without it: list the tags in use.",
    ),
    add: list[str] | None = typer.Option(
        None, "--add", "-a", metavar="TAG", help="Tags to add; several may follow one flag."
    ),
    remove: list[str] | None = typer.Option(
        None, "--remove", "-r", metavar="TAG", help="Tags to remove (before adding)."
    ),
    fmt: Format = FormatOption,
) -> None:
    """OSMO's workflow tags: change the tags of workflows (remove applied before add), or
    list the tags in use. `workflow list --tags T` finds them. JSON: [{"id", "tags"}], or
    the list of tags."""
    client = Client()
    if not workflows:
        if add or remove:
            raise typer.BadParameter(
                "--add and --remove need --workflow", param_hint="'--workflow'"
            )
        in_use: list[str] = client.json("GET", "/api/tag")
        emit(
            in_use,
            fmt,
            lambda tags: typer.echo("\n".join(tags) if tags else "No tags"),
        )
        return
    data: list[TagAnswer] = client.json(
        "POST",
        "/api/tag",
        json={"workflows": _flat(workflows), "add": _flat(add), "remove": _flat(remove)},
    )
    emit(
        data,
        fmt,
        lambda rows: _echo_lines(
            f"Workflow {r['id']} tags: {', '.join(r['tags']) or '-'}" for r in rows
        ),
    )


def delete(
    workflow_ids: list[str] = typer.Argument(
        ..., metavar="WORKFLOW_ID...", help="Ended workflows to delete."
    ),
    fmt: Format = FormatOption,
) -> None:
    """Delete ended workflows: their records and run folders (logs, task folders,
    {{output}} folders); never what they uploaded (datasets, output URLs). All or none: a
    running workflow is refused (exit 4: cancel it first), another user's too (exit 8)
    unless you are an admin. JSON: {"deleted": [ids]}."""
    data: DeleteAnswer = Client().json("POST", "/api/workflow/delete", json={"ids": workflow_ids})
    emit(data, fmt, lambda d: _print_lines(f"Workflow {w} deleted" for w in d["deleted"]))


def _duration_s(value: str) -> float:
    from trainyard.quantity import parse_duration_s

    try:
        return parse_duration_s(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


class PruneTotal(TypedDict):
    """What ``workflow prune`` did over its requests (``PruneAnswer``s): ids deleted (with
    ``dry_run``: that would be) and those left, each once."""

    deleted: list[str]
    kept: list[KeptAnswer]
    dry_run: NotRequired[bool]


def prune(
    older_than: str = typer.Option(
        "7d",
        "--older-than",
        metavar="DURATION",
        help="Delete the workflows that ended more than this long ago (30s, 12h, 7d, seconds).",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be deleted."),
    fmt: Format = FormatOption,
) -> None:
    """Delete your ended workflows (an admin: everyone's) that ended more than DURATION ago,
    as `workflow delete` does; running ones are never touched. JSON: {"deleted": [ids],
    "kept": [{"id", "reason"}]} ("dry_run": true with --dry-run)."""
    body = {"older_than_s": _duration_s(older_than), "dry_run": dry_run}
    client = Client()
    data: PruneTotal = {"deleted": [], "kept": []}
    while True:  # the server deletes a bounded batch per request
        answer: PruneAnswer = client.json("POST", "/api/workflow/prune", json=body)
        data["deleted"] += answer["deleted"]
        data["kept"] += answer["kept"]
        if not answer.get("more") or not answer["deleted"]:
            break
    data["kept"] = list({k["id"]: k for k in data["kept"]}.values())  # asked again: once
    if dry_run:
        data["dry_run"] = True

    def show(d: PruneTotal) -> None:
        verb = "would be deleted" if d.get("dry_run") else "deleted"
        for workflow_id in d["deleted"]:
            console.print(f"Workflow {workflow_id} {verb}")
        for kept in d["kept"]:
            console.print(f"Workflow {kept['id']} kept: {kept['reason']}", markup=False)
        console.print(f"{len(d['deleted'])} workflow(s) {verb}")

    emit(data, fmt, show)


def register(app: typer.Typer) -> None:
    """Add ``cancel``, ``restart``, ``tag``, ``delete`` and ``prune`` to the ``workflow``
    sub-app."""
    app.command()(cancel)
    app.command()(restart)
    app.command()(tag)
    app.command()(delete)
    app.command()(prune)


def _echo_lines(lines: Iterable[str]) -> None:
    """Echo each of ``lines`` (typer.echo: no markup)."""
    for line in lines:
        typer.echo(line)


def _print_lines(lines: Iterable[str]) -> None:
    """Print each of ``lines`` on the console."""
    for line in lines:
        console.print(line)
