"""``trainyard workflow submit|query|list|logs|cancel|restart``: talk to the server.

Exit codes: 0 success; for ``submit --wait``, 0 only when the workflow COMPLETED, 1 when it
ended otherwise (FAILED*, timeouts, cancelled); trainyard errors use their own codes
(``trainyard.errors``).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, table
from trainyard.cli.request import spec_request
from trainyard.server.schema import SpecRequest
from trainyard.spec.values import parse_labels

__all__ = ["register"]

TERMINAL_PREFIXES = ("COMPLETED", "FAILED")


def _is_terminal(status: str) -> bool:
    return status.startswith(TERMINAL_PREFIXES)


def _flat(values: Optional[list[str]]) -> list[str]:
    """A repeated option's values (``cli.main`` already split ``--set a=1 b=2``)."""
    return list(values or [])


def _request(spec: str, *, set_values: list[str], set_strings: list[str], set_env: list[str],
             pool: str | None, labels: list[str]) -> SpecRequest | None:
    path = Path(spec)
    if not path.exists():
        return None
    return spec_request(path, set_values=set_values, set_strings=set_strings, set_env=set_env,
                        pool=pool, labels=parse_labels(labels))


def _print_progress(seen: dict[str, str], data: dict[str, Any], started: float) -> None:
    elapsed = time.monotonic() - started
    for group in data["groups"]:
        for task in group["tasks"]:
            key = task["name"] if group["name"] == task["name"] else f"{group['name']}/{task['name']}"
            status = task["status"]
            if seen.get(key) != status:
                seen[key] = status
                node = f" on {task['node']}" if task.get("node") else ""
                code = f" (exit {task['exit_code']})" if task.get("exit_code") is not None else ""
                retry = f" retry {task['retry_id']}" if task.get("retry_id") else ""
                console.print(f"[dim]{elapsed:7.1f}s[/dim] {key}{retry} {status}{node}{code}")


def _follow_logs(client: Client, workflow_id: str, stop: threading.Event) -> None:
    try:
        for line in client.stream_lines(f"/api/workflow/{workflow_id}/logs", follow=True):
            if stop.is_set():
                return
            console.print(line, markup=False)
    except Exception as exc:  # noqa: BLE001 - the log view must not kill --wait
        console.print(f"[dim](log stream ended: {exc})[/dim]")


def wait_for(client: Client, workflow_id: str, *, logs: bool, poll_s: float = 0.5) -> dict[str, Any]:
    """Print progress (and logs) until the workflow ends; return its final query."""
    started, seen = time.monotonic(), {}
    stop = threading.Event()
    follower = threading.Thread(target=_follow_logs, args=(client, workflow_id, stop), daemon=True)
    if logs:
        follower.start()
    while True:
        data = client.json("GET", f"/api/workflow/{workflow_id}")
        _print_progress(seen, data, started)
        if _is_terminal(data["status"]):
            break
        time.sleep(poll_s)
    if logs:
        follower.join(timeout=5)
    stop.set()
    console.print(f"Workflow {workflow_id} {data['status']} after {time.monotonic() - started:.1f}s")
    _print_outputs(data)
    return data


def _print_outputs(data: dict[str, Any]) -> None:
    """Where each lead task's output went: its folder and its uploads (datasets, URLs)."""
    for group in data["groups"]:
        for task in group["tasks"]:
            if not task["lead"] or task["status"] != "COMPLETED":
                continue
            console.print(f"Output of {task['name']}: {task.get('output_dir')}", markup=False)
            for target in task.get("outputs", []):
                hint = ""
                if target.startswith("dataset "):
                    name = target.split(" ", 1)[1]
                    hint = f" (`trainyard dataset info {name}`, `trainyard dataset download {name} DIR`)"
                console.print(f"  uploaded to {target}{hint}", markup=False)


def submit(
    spec: str = typer.Argument(..., help="a spec file, or the id of a workflow to submit again"),
    set_values: Optional[list[str]] = typer.Option(None, "--set", help="k=v (YAML-typed)"),
    set_strings: Optional[list[str]] = typer.Option(None, "--set-string", help="k=v (string)"),
    set_env: Optional[list[str]] = typer.Option(None, "--set-env", help="K=V for every task"),
    pool: Optional[str] = typer.Option(None, "--pool", help="pool to run on"),
    label: Optional[list[str]] = typer.Option(None, "--label", help="k=v workflow label"),
    dry_run: bool = typer.Option(False, "--dry-run", help="validate and print, run nothing"),
    wait: bool = typer.Option(False, "--wait", help="show progress until it ends"),
    logs: bool = typer.Option(False, "--logs", help="with --wait, stream the task logs too"),
    fmt: Format = FormatOption,
) -> None:
    """Submit a workflow; print its id (and with --wait, its progress)."""
    client = Client()
    req = _request(spec, set_values=_flat(set_values), set_strings=_flat(set_strings),
                   set_env=_flat(set_env), pool=pool, labels=label or [])
    if req is None:
        overrides = SpecRequest(spec_text="", set=_flat(set_values), set_string=_flat(set_strings),
                                set_env=_flat(set_env), pool=pool, labels=parse_labels(label or []))
        result = client.json("POST", f"/api/workflow/{spec}/resubmit",
                             json=overrides.model_dump())
    else:
        result = client.json("POST", "/api/workflow", params={"dry_run": dry_run},
                             json=req.model_dump())
    if dry_run:
        emit(result, fmt, _print_dry_run)
        return
    emit(result, fmt, lambda d: console.print(f"Workflow submitted: {d['id']}"))
    if wait:
        final = wait_for(client, result["id"], logs=logs)
        raise typer.Exit(0 if final["status"] == "COMPLETED" else 1)


def _print_dry_run(data: dict[str, Any]) -> None:
    """The rendered spec, then what the backend would be handed (Slurm: each group's sbatch
    command and script)."""
    typer.echo(data["spec"])
    for shown in data.get("backend", []):
        typer.echo(f"# ==== group {shown['group']} on pool {data['pool']}")
        typer.echo(shown["text"])


def _query_table(data: dict[str, Any]) -> None:
    console.print(f"Workflow {data['id']} ({data['name']}): {data['status']}, "
                  f"submitted by {data['submitted_by']} at {data['submit_time']}")
    rows = []
    for group in data["groups"]:
        for t in group["tasks"]:
            rows.append([group["name"], t["name"] + (" (lead)" if t["lead"] else ""), t["status"],
                         t["retry_id"], t["exit_code"], t["node"], t["start_time"], t["end_time"]])
            for r in t.get("retries", []):
                rows.append(["", f"  retry {r['retry_id']}", r["status"], r["retry_id"],
                             r["exit_code"], r["node"], r["start_time"], r["end_time"]])
    table(["group", "task", "status", "retry", "exit", "node", "start", "end"], rows)


def query(workflow_id: str, verbose: bool = typer.Option(False, "--verbose", "-v",
          help="list every retry"), fmt: Format = FormatOption) -> None:
    """Show a workflow's groups and tasks."""
    data = Client().json("GET", f"/api/workflow/{workflow_id}", params={"verbose": verbose})
    emit(data, fmt, _query_table)


def list_workflows(
    status: Optional[list[str]] = typer.Option(None, "--status", help="only these statuses"),
    name: Optional[str] = typer.Option(None, "--name", help="name contains"),
    label: Optional[list[str]] = typer.Option(None, "--label", help="k=v, all must match"),
    count: Optional[int] = typer.Option(None, "--count", "-c", help="at most this many"),
    fmt: Format = FormatOption,
) -> None:
    """List workflows, newest first."""
    params: dict[str, Any] = {"status": status or [], "label": label or []}
    if name:
        params["name"] = name
    if count:
        params["count"] = count
    data = Client().json("GET", "/api/workflow", params=params)
    emit(data, fmt, lambda rows: table(
        ["id", "name", "status", "pool", "submitted by", "submit time"],
        [[w["id"], w["name"], w["status"], w["pool"], w["submitted_by"], w["submit_time"]]
         for w in rows]))


def logs(
    workflow_id: str,
    task: Optional[str] = typer.Option(None, "--task", "-t", help="only this task"),
    retry_id: Optional[int] = typer.Option(None, "--retry-id", help="only this attempt"),
    follow: bool = typer.Option(False, "--follow", help="keep printing until it ends"),
    lines: Optional[int] = typer.Option(None, "-n", help="only the last N lines"),
) -> None:
    """Print a workflow's task logs (OSMO's line format)."""
    client = Client()
    params: dict[str, Any] = {k: v for k, v in {"task": task, "retry_id": retry_id}.items()
                              if v is not None}
    if follow:
        for line in client.stream_lines(f"/api/workflow/{workflow_id}/logs", follow=True, **params):
            typer.echo(line)
        return
    if lines:
        params["lines"] = lines
    typer.echo(client.request("GET", f"/api/workflow/{workflow_id}/logs", params=params).text,
               nl=False)


def cancel(workflow_id: str, fmt: Format = FormatOption) -> None:
    """Cancel a workflow: stop every task; it ends FAILED_CANCELED."""
    data = Client().json("POST", f"/api/workflow/{workflow_id}/cancel")
    emit(data, fmt, lambda d: console.print(f"Workflow {d['id']} cancel requested: {d['status']}"))


def restart(workflow_id: str, wait: bool = typer.Option(False, "--wait"),
            fmt: Format = FormatOption) -> None:
    """Run a failed workflow's failed groups again, keeping its completed ones."""
    client = Client()
    data = client.json("POST", f"/api/workflow/{workflow_id}/restart")
    emit(data, fmt, lambda d: console.print(f"Workflow {d['id']} restarted: {d['status']}"))
    if wait:
        final = wait_for(client, workflow_id, logs=False)
        raise typer.Exit(0 if final["status"] == "COMPLETED" else 1)


def register(app: typer.Typer) -> None:
    """Add these commands to the ``workflow`` sub-app."""
    app.command()(submit)
    app.command()(query)
    app.command("list")(list_workflows)
    app.command()(logs)
    app.command()(cancel)
    app.command()(restart)
