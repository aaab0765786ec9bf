"""``trainyard workflow submit|query|list|logs|cancel|restart|delete|prune``: talk to the
server.

Exit codes: 0 success; for ``submit --wait``, 0 only when the workflow COMPLETED, 1 when it
ended otherwise (FAILED*, timeouts, cancelled); trainyard errors use their own codes (the
table in ``cli.main``'s help). With ``--format json`` stdout holds one JSON document (for
``logs``, JSON Lines); progress lines then go to stderr.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, NotRequired, TypedDict, cast

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (
    Format,
    FormatOption,
    LongFormatOption,
    console,
    emit,
    err_console,
    print_spec_warnings,
    short_time,
    spec_warnings,
    table,
)
from trainyard.cli.request import SpecBody, spec_request
from trainyard.errors import NotFoundError, RefusedError, SpecError, SpecProblem, TrainyardError
from trainyard.spec.values import parse_labels
from trainyard.status import WorkflowStatus

if TYPE_CHECKING:  # rich is imported when the first progress line is printed (cli.output)
    from rich.console import Console

    from trainyard.server.answers import (
        AttemptAnswer,
        CancelAnswer,
        DeleteAnswer,
        EventAnswer,
        GroupAnswer,
        KeptAnswer,
        PruneAnswer,
        TagAnswer,
        TaskAnswer,
        WorkflowAnswer,
        WorkflowSummary,
    )

__all__ = [
    "register",
    "wait_for",
    "finish_wait",
    "after_submit",
    "print_dry_run",
    "looks_like_workflow_id",
]

TERMINAL_PREFIXES = ("COMPLETED", "FAILED")
WORKFLOW_ID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]*[A-Za-z0-9])?-\d+$")
"""A workflow id: the workflow's name (letters, digits, '-', '_'), '-', its number."""
STATUSES = tuple(s.value for s in WorkflowStatus)
_STATUS_HELP = (
    f"Only workflows with this status; several may follow one flag: {', '.join(STATUSES)}."
)
WorkflowIdArg = typer.Argument(..., metavar="WORKFLOW_ID", help="The workflow's id (NAME-N).")


def _prog() -> str:
    """The program's name for hints that name a command (``osmo`` or ``trainyard``)."""
    from trainyard.cli.progname import program

    return program()


def _is_terminal(status: str) -> bool:
    return status.startswith(TERMINAL_PREFIXES)


def _flat(values: list[str] | None) -> list[str]:
    """A repeated option's values (``cli.main`` already split ``--set a=1 b=2``)."""
    return list(values or [])


def looks_like_workflow_id(text: str) -> bool:
    """True for ``NAME-N`` (``hello-osmo-3``); a file name with a '.' or '/' never is."""
    return bool(WORKFLOW_ID.match(text))


def _request(
    spec: str,
    *,
    set_values: list[str],
    set_strings: list[str],
    set_env: list[str],
    pool: str | None,
    labels: list[str],
) -> SpecBody | None:
    """The request for a spec file; None when ``spec`` is no file but looks like a workflow
    id. Raises SpecError when it is neither (the file does not exist)."""
    path = Path(spec)
    if not path.exists():
        if looks_like_workflow_id(spec):
            return None
        raise SpecError(
            [
                SpecProblem(
                    "",
                    "no such spec file; check the path (to submit a "
                    "workflow again, give its id: NAME-N)",
                    file=spec,
                )
            ]
        )
    return spec_request(
        path,
        set_values=set_values,
        set_strings=set_strings,
        set_env=set_env,
        pool=pool,
        labels=parse_labels(labels),
    )


def _task_key(group: GroupAnswer, task: TaskAnswer) -> str:
    return task["name"] if group["name"] == task["name"] else f"{group['name']}/{task['name']}"


def _exit_text(attempt: AttemptAnswer) -> tuple[str, str | None]:
    """`` (exit N)``, or for an ended attempt without an exit code why it has none; and
    the reason still to show after it (None: said already)."""
    reason = (attempt.get("failure_reason") or "").splitlines()
    why = reason[0] if reason else None
    if attempt.get("exit_code") is not None:
        return f" (exit {attempt['exit_code']})", why
    if attempt.get("status") == "COMPLETED":  # a sibling stopped by its lead: OSMO's reason
        return " (no exit code)", why
    return "", why


def _attempt_line(key: str, attempt: AttemptAnswer) -> str:
    node = f" on {attempt['node']}" if attempt.get("node") else ""
    code, why = _exit_text(attempt)
    retry = f" retry {attempt['retry_id']}" if attempt.get("retry_id") else ""
    return f"{key}{retry} {attempt['status']}{node}{code}{f': {why}' if why else ''}"


def _clock(started: float) -> str:
    """The time now as the log lines print it (``YYYY/MM/DD HH:MM:SS``, UTC, seconds) and
    the seconds since ``started`` (a ``time.monotonic()``): ``2026/11/27 01:00:09 +9.0s``."""
    stamp = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime())
    return f"{stamp} +{time.monotonic() - started:.1f}s"


def _print_progress(
    view: Console, seen: dict[Any, str], data: WorkflowAnswer, started: float
) -> None:
    """Print each change since the last answer: the workflow's status (a restart shows it
    going back to PENDING or RUNNING) and every task attempt's, earlier attempts included
    (``retries`` of a verbose query), so a RESCHEDULED attempt is shown even when its retry
    started before this answer. Each line starts with ``_clock``: the log lines' clock."""
    elapsed = f"[dim]{_clock(started)}[/dim]"
    if seen.get("workflow") not in (None, data["status"]) and not _is_terminal(data["status"]):
        view.print(f"{elapsed} workflow {data['status']}", emoji=False)
    seen["workflow"] = data["status"]
    for group in data["groups"]:
        for task in group["tasks"]:
            key = _task_key(group, task)
            earlier = [a for a in task.get("retries", []) if a["retry_id"] != task["retry_id"]]
            for attempt in [*earlier, task]:
                if seen.get((key, attempt["retry_id"])) != attempt["status"]:
                    seen[(key, attempt["retry_id"])] = attempt["status"]
                    view.print(f"{elapsed} {_attempt_line(key, attempt)}", emoji=False)
    for wait in data.get("waiting") or []:
        if seen.get(("waiting", wait["group"])) != wait["reason"]:
            seen[("waiting", wait["group"])] = wait["reason"]
            view.print(
                f"{_clock(started)} group {wait['group']} {wait['status']}: {wait['reason']}",
                markup=False,
                emoji=False,
                highlight=False,
                soft_wrap=True,
            )
    if _is_terminal(data["status"]):
        view.print(f"{elapsed} workflow {data['status']}", emoji=False)


def _print_failures(view: Console, workflow_id: str, data: WorkflowAnswer) -> None:
    """For a workflow that did not complete: each task that failed of itself (not
    FAILED_UPSTREAM, not cancelled), why, its exit code, the last lines of its log (those
    the store keeps: ``log_tail``) and the command that prints its whole log; the task that
    failed the workflow (the answer's ``failure``) first."""
    failure = data.get("failure")
    first = failure["task"] if failure else None
    tasks = [t for g in data["groups"] for t in g["tasks"]]
    for task in sorted(tasks, key=lambda t: t["name"] != first):
        status = task["status"]
        if not status.startswith("FAILED") or status in ("FAILED_UPSTREAM", "FAILED_CANCELED"):
            continue
        code = f" (exit code {task['exit_code']})" if task.get("exit_code") is not None else ""
        why = f": {task['failure_reason']}" if task.get("failure_reason") else ""
        view.print(
            f"Task {task['name']} retry {task['retry_id']} {status}{code}{why}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        print_log_tail(view, task.get("log_tail") or [])
        view.print(
            f"  its log: {_prog()} workflow logs {workflow_id} --task {task['name']} "
            f"--retry-id {task['retry_id']}",
            markup=False,
            highlight=False,
        )


def print_log_tail(view: Console, lines: list[str]) -> None:
    """The last lines of a failed attempt's log, indented under a heading (none: nothing)."""
    if not lines:
        return
    view.print(f"  last {len(lines)} line(s) of its log:", markup=False, highlight=False)
    for line in lines:
        view.print(f"    | {line}", markup=False, highlight=False, soft_wrap=True)


def print_waiting(view: Console, data: WorkflowAnswer, prefix: str = "") -> None:
    """Each group that waits to start and why (the answer's ``waiting``)."""
    for wait in data.get("waiting") or []:
        view.print(
            f"{prefix}group {wait['group']} {wait['status']}: {wait['reason']}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _follow_logs(view: Console, client: Client, workflow_id: str, stop: threading.Event) -> None:
    try:
        for line in client.stream_lines(f"/api/workflow/{workflow_id}/logs", follow=True):
            if stop.is_set():
                return
            view.print(line, markup=False)
    except Exception as exc:  # noqa: BLE001 - the log view must not kill --wait
        view.print(f"[dim](log stream ended: {exc})[/dim]")


LONG_POLL_S = 5.0
"""How long ``--wait`` asks the server to hold each status query (long poll) when nothing
changes; the server answers at once on any change of status (and when the workflow ends)."""


FINAL_LOGS_S = 10.0
"""How long ``--wait`` waits, once the workflow ended, for the log stream to bring its last
lines (the server ends the stream once the logs are drained) before it prints the end."""


def _query_long_poll(
    client: Client, workflow_id: str, known: str | None, wait_s: float
) -> tuple[WorkflowAnswer, str | None]:
    """The workflow's query, held by the server until its progress differs from ``known``
    (or ``wait_s`` passed); (the answer, its progress key, None from a server without long
    polls, which answers at once)."""
    params: dict[str, Any] = {"verbose": True}
    if known is not None:
        params.update(known=known, wait_s=wait_s)
    response = client.request("GET", f"/api/workflow/{workflow_id}", params=params)
    return response.json(), response.headers.get("x-trainyard-progress")


def wait_for(
    client: Client,
    workflow_id: str,
    *,
    logs: bool,
    poll_s: float = 0.25,
    max_poll_s: float = 1.0,
    view: Console = console,
) -> WorkflowAnswer:
    """Print progress (and logs) on ``view`` until the workflow ends; return its final query.
    Each status query is a long poll (``LONG_POLL_S``): the server answers when the progress
    changed or the workflow ended, as soon as the engine stores the change. A
    server without long polls (or one that answers unchanged at once: it holds too many) is
    asked every ``poll_s`` seconds at first, then less often, down to every ``max_poll_s``
    (a long run waited on by many clients does not load it)."""
    started, seen = time.monotonic(), dict[Any, str]()
    stop = threading.Event()
    follower = threading.Thread(
        target=_follow_logs, args=(view, client, workflow_id, stop), daemon=True
    )
    if logs:
        follower.start()
    known: str | None = None
    while True:
        asked, before = time.monotonic(), known
        data, known = _query_long_poll(client, workflow_id, known, LONG_POLL_S)
        if _is_terminal(data["status"]):
            break
        _print_progress(view, seen, data, started)
        if known is None or (known == before and time.monotonic() - asked < poll_s):
            # a server without long polls, or one holding too many: ask again later
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, max_poll_s)
    if logs:
        follower.join(timeout=FINAL_LOGS_S)  # the last lines (uploads) before the end
    stop.set()
    _print_progress(view, seen, data, started)
    view.print(f"Workflow {workflow_id} {data['status']} after {time.monotonic() - started:.1f}s")
    _print_outputs(view, data)
    if data["status"] != "COMPLETED":
        _print_failures(view, workflow_id, data)
    return data


def finish_wait(client: Client, workflow_id: str, fmt: Format, *, logs: bool = False) -> NoReturn:
    """``--wait``: progress until the workflow ends, then exit 0 only if it COMPLETED (on
    a failure, which task failed and the command that prints its log). Ctrl-C stops only
    the waiting: it says the workflow goes on and how to follow it (exit 130).

    With ``--format json`` the progress goes to stderr and stdout gets one JSON document,
    the final ``workflow query`` object.
    """
    view = err_console if fmt is Format.json else console
    try:
        final = wait_for(client, workflow_id, logs=logs, view=view)
    except KeyboardInterrupt:
        err_console.print(
            f"\nStopped waiting; workflow {workflow_id} goes on.\n"
            f"  follow it: trainyard workflow logs {workflow_id}\n"
            f"  see it:    trainyard workflow query {workflow_id}\n"
            f"  stop it:   trainyard workflow cancel {workflow_id}",
            markup=False,
        )
        raise typer.Exit(130) from None
    if fmt is Format.json:
        emit(final, fmt, lambda _d: None)
    raise typer.Exit(0 if final["status"] == "COMPLETED" else 1)


def _print_outputs(view: Console, data: WorkflowAnswer) -> None:
    """Where each lead task's output went: its folder and its uploads (datasets, URLs)."""
    for group in data["groups"]:
        for task in group["tasks"]:
            if not task["lead"] or task["status"] != "COMPLETED":
                continue
            view.print(f"Output of {task['name']}: {task.get('output_dir')}", markup=False)
            for target in task.get("outputs", []):
                view.print(f"  uploaded to {target}", markup=False)
                if target.startswith("dataset "):
                    name = target.split(" ", 1)[1]
                    view.print(f"    see it:      trainyard dataset info {name}", markup=False)
                    view.print(
                        f"    download it: trainyard dataset download {name} DIR", markup=False
                    )


# Options that `workflow submit` and `app submit` share.
SetStringOpt = typer.Option(
    None, "--set-string", metavar="NAME=VALUE", help="Template value kept as a string."
)
SetEnvOpt = typer.Option(
    None, "--set-env", metavar="NAME=VALUE", help="Environment variable of every task."
)
PoolOpt = typer.Option(
    None,
    "--pool",
    "-p",
    help="Pool to run on (default: the spec's pool, "
    "else your default pool: `profile set pool`, else 'local').",
)
PriorityOpt = typer.Option(
    None,
    "--priority",
    metavar="HIGH|NORMAL|LOW",
    help="OSMO's scheduling priority, kept with the workflow and shown "
    "by query and list (default NORMAL).",
)
LabelOpt = typer.Option(
    None, "--label", metavar="KEY=VALUE", help="Workflow label; overrides the spec's."
)
DryRunOpt = typer.Option(
    False,
    "--dry-run",
    help="Validate and print the rendered spec and "
    "what the backend would be handed; create nothing.",
)
RsyncOpt = typer.Option(
    None,
    "--rsync",
    metavar="LOCAL:REMOTE",
    help="Upload LOCAL into the lead task once it runs, and again on every "
    "change, from a background daemon until the task ends (`workflow "
    "rsync status|stop`).",
)
WaitOpt = typer.Option(
    False, "--wait", help="Show progress until it ends; exit 0 only if it COMPLETED."
)


def submit(
    spec: str = typer.Argument(
        ...,
        metavar="SPEC|WORKFLOW_ID",
        help="A spec file, or the id of a workflow (NAME-N) to submit its stored spec again.",
    ),
    set_values: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="NAME=VALUE",
        help="Template value, YAML-typed; several pairs "
        "may follow one flag. With a workflow id: added to its stored values, and wins.",
    ),
    set_strings: list[str] | None = SetStringOpt,
    set_env: list[str] | None = SetEnvOpt,
    pool: str | None = PoolOpt,
    priority: str | None = PriorityOpt,
    label: list[str] | None = LabelOpt,
    dry_run: bool = DryRunOpt,
    rsync: str | None = RsyncOpt,
    wait: bool = WaitOpt,
    logs: bool = typer.Option(False, "--logs", help="With --wait, stream the task logs too."),
    fmt: Format = FormatOption,
) -> None:
    """Submit a workflow; print its id (and with --wait, its progress).

    Spec warnings (e.g. a key given twice in one mapping) go to stderr. With --format json,
    stdout is one JSON document: {"id", "name", "status", "warnings"}; with --wait,
    the final `workflow query` object (progress then goes to stderr); with --dry-run,
    {"dry_run", "name", "pool", "spec", "backend"}.
    """
    req = _request(
        spec,
        set_values=_flat(set_values),
        set_strings=_flat(set_strings),
        set_env=_flat(set_env),
        pool=pool,
        labels=label or [],
    )
    client = Client()
    if req is None:
        overrides = SpecBody(
            spec_text="",
            set=_flat(set_values),
            set_string=_flat(set_strings),
            set_env=_flat(set_env),
            pool=pool,
            labels=parse_labels(label or []),
            priority=checked_priority(priority),
        )
        result = client.json(
            "POST",
            f"/api/workflow/{spec}/resubmit",
            params={"dry_run": dry_run},
            json=overrides.to_json(),
        )
    else:
        req = replace(req, default_pool=profile_pool(), priority=checked_priority(priority))
        result = client.json(
            "POST", "/api/workflow", params={"dry_run": dry_run}, json=req.to_json()
        )
    after_submit(client, result, fmt, dry_run=dry_run, wait=wait, logs=logs, rsync=rsync)


PRIORITIES = ("HIGH", "NORMAL", "LOW")


def checked_priority(priority: str | None) -> str | None:
    """``--priority`` upper-cased (OSMO takes any case), None when not given (the server
    keeps NORMAL, or a resubmitted workflow's own); a usage error (exit 2) naming the
    choices otherwise."""
    if priority is None:
        return None
    wanted = priority.upper()
    if wanted not in PRIORITIES:
        raise typer.BadParameter(
            f"{priority!r} is not one of {', '.join(PRIORITIES)}", param_hint="'--priority'"
        )
    return wanted


def profile_pool() -> str | None:
    """The user's default pool (``profile set pool``), for a spec that names none."""
    from trainyard.cli.profile import default_pool

    return default_pool()


def after_submit(
    client: Client,
    result: dict[str, Any],
    fmt: Format,
    *,
    dry_run: bool,
    wait: bool,
    logs: bool = False,
    rsync: str | None = None,
) -> None:
    """Print what a submit answered (its spec warnings on stderr); with ``rsync``, start
    its upload daemon (``submit --rsync``); with ``wait``, follow it to its end (and
    exit)."""
    print_spec_warnings(spec_warnings(result))
    if dry_run:
        emit(result, fmt, print_dry_run)
        return
    if not wait:
        emit(result, fmt, lambda d: typer.echo(f"Workflow submitted: {d['id']}"))
    elif fmt.human:
        typer.echo(f"Workflow submitted: {result['id']}")
    if rsync:
        from trainyard.cli.workflow_interactive import start_upload_daemon

        start_upload_daemon(result["id"], rsync)
    if wait:
        finish_wait(client, result["id"], fmt, logs=logs)


def print_dry_run(data: dict[str, Any]) -> None:
    """The rendered spec, then what the backend would be handed (Slurm: each group's sbatch
    command and script)."""
    typer.echo(data["spec"])
    for shown in data.get("backend", []):
        typer.echo(f"# ==== group {shown['group']} on pool {data['pool']}")
        typer.echo(shown["text"])


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


def _inside(workflow_id: str, token: str | None) -> bool:
    """Whether the CLI runs inside a task of ``workflow_id``: its token is a task token of
    that workflow (``tasktokens``: ``tyt1.<workflow id>.<mac>``; only read here, the server
    checks it)."""
    from trainyard.tasktokens import PREFIX

    return token is not None and token.startswith(f"{PREFIX}{workflow_id}.")


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
    """Add these commands to the ``workflow`` sub-app."""
    app.command()(submit)
    app.command()(query)
    app.command("list")(list_workflows)
    app.command()(logs)
    app.command()(cancel)
    app.command()(events)
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
