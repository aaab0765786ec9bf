"""``trainyard workflow submit`` and its ``--wait``, and what the other commands that talk to
the server share (``workflow_query``: query, events, list, logs; ``workflow_control``:
cancel, restart, tag, delete, prune).

Exit codes: 0 success; for ``submit --wait``, 0 only when the workflow COMPLETED, 1 when it
ended otherwise (FAILED*, timeouts, cancelled); trainyard errors use their own codes (the
table in ``cli.main``'s help). With ``--format json`` stdout holds one JSON document (for
``logs``, JSON Lines); progress lines then go to stderr.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (
    Format,
    FormatOption,
    console,
    emit,
    err_console,
    print_spec_warnings,
    spec_warnings,
)
from trainyard.cli.request import SpecBody, spec_request
from trainyard.errors import SpecError, SpecProblem
from trainyard.spec.values import parse_labels
from trainyard.status import WorkflowStatus

if TYPE_CHECKING:  # rich is imported when the first progress line is printed (cli.output)
    from rich.console import Console

    from trainyard.server.answers import (
        AttemptAnswer,
        DryRunAnswer,
        GroupAnswer,
        SubmitAnswer,
        TaskAnswer,
        WorkflowAnswer,
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


def _inside(workflow_id: str, token: str | None) -> bool:
    """Whether the CLI runs inside a task of ``workflow_id``: its token is a task token of
    that workflow (``tasktokens``: ``tyt1.<workflow id>.<mac>``; only read here, the server
    checks it)."""
    from trainyard.tasktokens import PREFIX

    return token is not None and token.startswith(f"{PREFIX}{workflow_id}.")


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
    result: SubmitAnswer | DryRunAnswer
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
    result: SubmitAnswer | DryRunAnswer,
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
    result = cast("SubmitAnswer", result)  # not a dry run: the server made the workflow
    if not wait:
        emit(result, fmt, lambda d: typer.echo(f"Workflow submitted: {d['id']}"))
    elif fmt.human:
        typer.echo(f"Workflow submitted: {result['id']}")
    if rsync:
        from trainyard.cli.workflow_interactive import start_upload_daemon

        start_upload_daemon(result["id"], rsync)
    if wait:
        finish_wait(client, result["id"], fmt, logs=logs)


def print_dry_run(data: DryRunAnswer) -> None:
    """The rendered spec, then what the backend would be handed (Slurm: each group's sbatch
    command and script)."""
    typer.echo(data["spec"])
    for shown in data.get("backend", []):
        typer.echo(f"# ==== group {shown['group']} on pool {data['pool']}")
        typer.echo(shown["text"])


def register(app: typer.Typer) -> None:
    """Add ``submit`` to the ``workflow`` sub-app."""
    app.command()(submit)
