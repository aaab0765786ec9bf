"""``trainyard app create|list|show|submit|delete``: named, versioned workflow templates.

An app belongs to the user who created it: only they or an admin may add versions to it or
delete it (403 otherwise, exit 8); anyone may list, show and submit it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional
from urllib.parse import quote

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (Format, FormatOption, console, emit, print_spec_warnings,
                                  spec_warnings, table)
from trainyard.cli.request import SpecBody, spec_request
from trainyard.cli.workflow_ops import (DryRunOpt, LabelOpt, PoolOpt, SetEnvOpt, SetStringOpt,
                                        WaitOpt, after_submit)
from trainyard.spec.values import parse_labels

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Named, versioned workflow templates.")

NameArg = typer.Argument(..., metavar="NAME", help="The app's name.")
VersionOpt = typer.Option(None, "--version", min=1, help="This version (default: the latest).")


def _in_path(name: str) -> str:
    """``name`` as one URL path segment (every byte that is not plainly safe escaped), so
    that any name reaches the server, which answers whether it is valid."""
    return quote(name, safe="")


@app.command()
def create(
    name: str = NameArg,
    spec: Path = typer.Argument(..., metavar="SPEC", help="The workflow spec (YAML with "
                                "Jinja); its localpath files are stored with it."),
    set_values: Optional[list[str]] = typer.Option(
        None, "--set", metavar="NAME=VALUE", help="Value to check the template with, for a "
        "variable without a default (such as a storage URL); not stored: give it again at "
        "submit."),
    set_strings: Optional[list[str]] = typer.Option(
        None, "--set-string", metavar="NAME=VALUE", help="As --set, kept as a string."),
    fmt: Format = FormatOption,
) -> None:
    """Store SPEC as a new version of app NAME, validated with its default values (and the
    --set values). Adding a version to someone else's app needs an admin."""
    req = spec_request(spec, set_values=set_values or [], set_strings=set_strings or [],
                       set_env=[])
    data = Client().json("POST", f"/api/app/{_in_path(name)}", json={
        "spec_text": req.spec_text, "files": req.files, "set": req.set,
        "set_string": req.set_string})
    print_spec_warnings(spec_warnings(data))
    emit(data, fmt, lambda d: console.print(f"App {d['name']} version {d['version']} created"))


@app.command("list")
def list_apps(fmt: Format = FormatOption) -> None:
    """List apps (latest versions)."""
    data = Client().json("GET", "/api/app")
    emit(data, fmt, lambda rows: table(["name", "version", "owner"],
                                       [[a["name"], a["version"], a["owner"]] for a in rows]))


@app.command()
def show(name: str = NameArg, version: Optional[int] = VersionOpt,
         fmt: Format = FormatOption) -> None:
    """Print an app's spec."""
    params = {"version": version} if version else {}
    data = Client().json("GET", f"/api/app/{_in_path(name)}", params=params)
    emit(data, fmt, lambda d: typer.echo(d["spec"]))


@app.command()
def submit(
    name: str = NameArg,
    set_values: Optional[list[str]] = typer.Option(
        None, "--set", metavar="NAME=VALUE",
        help="Template value, YAML-typed; several pairs may follow one flag."),
    set_strings: Optional[list[str]] = SetStringOpt,
    set_env: Optional[list[str]] = SetEnvOpt,
    pool: Optional[str] = PoolOpt,
    label: Optional[list[str]] = LabelOpt,
    version: Optional[int] = VersionOpt,
    dry_run: bool = DryRunOpt,
    wait: bool = WaitOpt,
    fmt: Format = FormatOption,
) -> None:
    """Submit app NAME as a workflow; print its id. JSON as `workflow submit`'s."""
    client = Client()
    req = SpecBody(spec_text="", set=set_values or [], set_string=set_strings or [],
                   set_env=set_env or [], pool=pool, labels=parse_labels(label or []))
    params: dict[str, object] = {"dry_run": dry_run}
    if version:
        params["version"] = version
    data = client.json("POST", f"/api/app/{_in_path(name)}/submit", params=params,
                       json=req.to_json())
    after_submit(client, data, fmt, dry_run=dry_run, wait=wait)


@app.command()
def delete(name: str = NameArg, fmt: Format = FormatOption) -> None:
    """Delete every version of app NAME (its owner or an admin only)."""
    data = Client().json("DELETE", f"/api/app/{_in_path(name)}")
    emit(data, fmt, lambda d: console.print(
        f"App {d['name']} deleted ({d['deleted_versions']} versions)"))
