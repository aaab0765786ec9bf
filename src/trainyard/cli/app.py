"""``trainyard app create|list|show|submit|delete``: named, versioned workflow templates."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, table
from trainyard.cli.request import spec_request
from trainyard.cli.workflow_ops import wait_for
from trainyard.server.schema import SpecRequest
from trainyard.spec.values import parse_labels

app = typer.Typer(no_args_is_help=True, help="Named, versioned workflow templates.")


@app.command()
def create(name: str, spec: Path, fmt: Format = FormatOption) -> None:
    """Store SPEC as a new version of app NAME (validated with its default values)."""
    req = spec_request(spec, set_values=[], set_strings=[], set_env=[])
    data = Client().json("POST", f"/api/app/{name}",
                         json={"spec_text": req.spec_text, "files": req.files})
    emit(data, fmt, lambda d: console.print(f"App {d['name']} version {d['version']} created"))


@app.command("list")
def list_apps(fmt: Format = FormatOption) -> None:
    """List apps (latest versions)."""
    data = Client().json("GET", "/api/app")
    emit(data, fmt, lambda rows: table(["name", "version", "owner"],
                                       [[a["name"], a["version"], a["owner"]] for a in rows]))


@app.command()
def show(name: str, version: Optional[int] = typer.Option(None, "--version"),
         fmt: Format = FormatOption) -> None:
    """Print an app's spec."""
    params = {"version": version} if version else {}
    data = Client().json("GET", f"/api/app/{name}", params=params)
    emit(data, fmt, lambda d: typer.echo(d["spec"]))


@app.command()
def submit(
    name: str,
    set_values: Optional[list[str]] = typer.Option(None, "--set"),
    set_strings: Optional[list[str]] = typer.Option(None, "--set-string"),
    set_env: Optional[list[str]] = typer.Option(None, "--set-env"),
    pool: Optional[str] = typer.Option(None, "--pool"),
    label: Optional[list[str]] = typer.Option(None, "--label"),
    version: Optional[int] = typer.Option(None, "--version"),
    wait: bool = typer.Option(False, "--wait"),
    fmt: Format = FormatOption,
) -> None:
    """Submit app NAME as a workflow."""
    client = Client()
    req = SpecRequest(spec_text="", set=set_values or [], set_string=set_strings or [],
                      set_env=set_env or [], pool=pool, labels=parse_labels(label or []))
    params = {"version": version} if version else {}
    data = client.json("POST", f"/api/app/{name}/submit", params=params, json=req.model_dump())
    emit(data, fmt, lambda d: console.print(f"Workflow submitted: {d['id']}"))
    if wait:
        final = wait_for(client, data["id"], logs=False)
        raise typer.Exit(0 if final["status"] == "COMPLETED" else 1)


@app.command()
def delete(name: str) -> None:
    """Delete every version of app NAME."""
    data = Client().json("DELETE", f"/api/app/{name}")
    console.print(f"App {data['name']} deleted ({data['deleted_versions']} versions)")
