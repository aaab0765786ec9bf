"""``trainyard app``: named, versioned workflow templates (OSMO's ``osmo app``).

An app belongs to the user who created it: only they or an admin may add versions to it,
rename or delete it (403 otherwise, exit 8); anyone may list, show and submit it. NAME may
be ``NAME:VERSION`` where a version is read or deleted (OSMO's form); ``--version N`` says
the same.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import (
    Format,
    FormatOption,
    console,
    emit,
    print_spec_warnings,
    short_time,
    spec_warnings,
    table,
)
from trainyard.cli.request import SpecBody, files_under, spec_request
from trainyard.cli.workflow_ops import (
    DryRunOpt,
    LabelOpt,
    PoolOpt,
    PriorityOpt,
    RsyncOpt,
    SetEnvOpt,
    SetStringOpt,
    WaitOpt,
    after_submit,
    checked_priority,
    profile_pool,
)
from trainyard.spec.values import parse_labels

if TYPE_CHECKING:
    from trainyard.server.answers import (
        AppAnswer,
        AppDeletedAnswer,
        AppRenamedAnswer,
        DryRunAnswer,
        SubmitAnswer,
    )

__all__ = ["app", "split_version"]

app = typer.Typer(no_args_is_help=True, help="Named, versioned workflow templates.")

NameArg = typer.Argument(..., metavar="NAME[:VERSION]", help="The app's name, or NAME:VERSION.")
VersionOpt = typer.Option(None, "--version", min=1, help="This version (default: the latest).")
FileOpt = typer.Option(
    None,
    "--file",
    "-f",
    metavar="FILE",
    help="The workflow spec (YAML with Jinja); its localpath files are stored with it.",
)
SetOpt = typer.Option(
    None,
    "--set",
    metavar="NAME=VALUE",
    help="Value to check the template "
    "with, for a variable without a default (such as a storage URL); not "
    "stored: give it again at submit.",
)
CheckStringOpt = typer.Option(
    None, "--set-string", metavar="NAME=VALUE", help="As --set, kept as a string."
)
ForceOpt = typer.Option(False, "--force", "-f", help="Do not ask to confirm.")


def split_version(name: str, version: int | None) -> tuple[str, int | None]:
    """``NAME:VERSION`` (OSMO's form) as (NAME, VERSION); ``--version`` for a plain name.
    A usage error (exit 2) when both give a version, or VERSION is not a number."""
    if ":" not in name:
        return name, version
    base, _, text = name.rpartition(":")
    if not text.isdigit() or int(text) < 1:
        raise typer.BadParameter(
            f"{name!r}: the version after ':' is a number from 1", param_hint="NAME"
        )
    if version is not None and version != int(text):
        raise typer.BadParameter(f"{name!r} and --version {version} disagree", param_hint="NAME")
    return base, int(text)


def _spec_path(spec: Path | None, file: Path | None) -> Path:
    if spec is not None and file is not None:
        raise typer.BadParameter("give the spec once: SPEC or --file", param_hint="'--file'")
    if spec is None and file is None:
        raise typer.BadParameter(
            "the spec is missing: give --file FILE (or SPEC)", param_hint="'--file'"
        )
    return spec or file  # type: ignore[return-value]


def _store_version(
    name: str,
    path: Path,
    set_values: list[str],
    set_strings: list[str],
    description: str | None,
    *,
    update: bool,
) -> AppAnswer:
    req = spec_request(path, set_values=set_values, set_strings=set_strings, set_env=[])
    data: AppAnswer = Client().json(
        "POST",
        f"/api/app/{_in_path(name)}",
        params={"update": update} if update else {},
        json={
            "spec_text": req.spec_text,
            "files": req.files,
            "set": req.set,
            "set_string": req.set_string,
            "description": description,
        },
    )
    print_spec_warnings(spec_warnings(data))
    return data


def _in_path(name: str) -> str:
    """``name`` as one URL path segment (every byte that is not plainly safe escaped), so
    that any name reaches the server, which answers whether it is valid."""
    return quote(name, safe="")


@app.command()
def create(
    name: str = typer.Argument(..., metavar="NAME", help="The app's name."),
    spec: Path | None = typer.Argument(None, metavar="[SPEC]", help="The spec (or --file)."),
    file: Path | None = FileOpt,
    description: str | None = typer.Option(
        None, "--description", "-d", help="What the app does (shown by info, list)."
    ),
    set_values: list[str] | None = SetOpt,
    set_strings: list[str] | None = CheckStringOpt,
    fmt: Format = FormatOption,
) -> None:
    """Store a spec as a new version of app NAME (OSMO: `app create NAME -d DESC -f FILE`),
    validated with its default values (and the --set values). Adding a version to someone
    else's app needs an admin."""
    data = _store_version(
        name, _spec_path(spec, file), set_values or [], set_strings or [], description, update=False
    )
    emit(
        data,
        fmt,
        lambda d: console.print(f"App {d['name']} version {d['version']} created", markup=False),
    )


@app.command()
def update(
    name: str = typer.Argument(..., metavar="NAME", help="An existing app."),
    file: Path | None = FileOpt,
    set_values: list[str] | None = SetOpt,
    set_strings: list[str] | None = CheckStringOpt,
    fmt: Format = FormatOption,
) -> None:
    """Store FILE as a new version of the existing app NAME (its description kept). An
    unknown app exits 3. (OSMO opens an editor without --file; here --file is needed.)"""
    data = _store_version(
        split_version(name, None)[0],
        _spec_path(None, file),
        set_values or [],
        set_strings or [],
        None,
        update=True,
    )
    emit(
        data,
        fmt,
        lambda d: console.print(f"App {d['name']} version {d['version']} created", markup=False),
    )


def _list_table(rows: list[AppAnswer]) -> None:
    table(
        ["name", "version", "owner", "created", "description"],
        [
            [
                a["name"],
                a["version"],
                a["owner"],
                short_time(a.get("create_time")),
                a.get("description") or "-",
            ]
            for a in rows
        ],
    )


@app.command("list")
def list_apps(
    name: str | None = typer.Option(None, "--name", "-n", help="Only names containing this."),
    user: list[str] | None = typer.Option(
        None, "--user", "-u", help="Only apps of these owners; several may follow one flag."
    ),
    all_users: bool = typer.Option(
        False,
        "--all-users",
        "-a",
        help="Every user's apps (osmo's default without it: yours; trainyard's: everyone's).",
    ),
    count: int = typer.Option(20, "--count", "-c", min=1, help="At most this many."),
    order: str = typer.Option(
        "asc", "--order", "-o", help="asc: latest at the bottom; desc: at the top."
    ),
    fmt: Format = FormatOption,
) -> None:
    """List apps (their latest versions), newest last. JSON: a list of {"name", "version",
    "owner", "description", "create_time"}."""
    from trainyard.cli.progname import by_program

    if order not in ("asc", "desc"):
        raise typer.BadParameter(f"{order!r} is not one of 'asc', 'desc'", param_hint="'--order'")
    params: dict[str, Any] = {"all_users": all_users or by_program(False, True) and not user}
    if name:
        params["name"] = name
    if user:
        params["user"] = list(user)
    rows: list[AppAnswer] = Client().json("GET", "/api/app", params=params)
    rows = sorted(rows, key=lambda a: a.get("create_time") or "")[-count:]
    if order == "desc":
        rows.reverse()
    emit(rows, fmt, _list_table)


@app.command()
def info(
    name: str = NameArg,
    count: int = typer.Option(
        20, "--count", "-c", min=1, help="At most this many versions (the latest)."
    ),
    order: str = typer.Option(
        "asc", "--order", "-o", help="asc: latest at the bottom; desc: at the top."
    ),
    fmt: Format = FormatOption,
) -> None:
    """Show an app and its versions (NAME:VERSION: that version only). JSON: a list of
    {"name", "version", "owner", "description", "create_time"}."""
    if order not in ("asc", "desc"):
        raise typer.BadParameter(f"{order!r} is not one of 'asc', 'desc'", param_hint="'--order'")
    base, version = split_version(name, None)
    rows: list[AppAnswer] = Client().json("GET", f"/api/app/{_in_path(base)}/versions")
    rows = [r for r in rows if version in (None, r["version"])][-count:]
    if order == "desc":
        rows.reverse()
    emit(rows, fmt, _list_table)


def _spec_of(name: str, version: int | None) -> AppAnswer:
    base, version = split_version(name, version)
    found: AppAnswer = Client().json(
        "GET", f"/api/app/{_in_path(base)}", params={"version": version} if version else {}
    )
    return found


@app.command()
def show(name: str = NameArg, version: int | None = VersionOpt, fmt: Format = FormatOption) -> None:
    """Print an app's spec (trainyard's show; OSMO's `show` lists the parameters). JSON:
    {"name", "version", "owner", "description", "create_time", "spec"}."""
    emit(_spec_of(name, version), fmt, lambda d: typer.echo(d["spec"]))


@app.command()
def spec(name: str = NameArg, version: int | None = VersionOpt) -> None:
    """Print an app version's spec as written (OSMO's `app spec`)."""
    text = _spec_of(name, version)["spec"]
    typer.echo(text, nl=not text.endswith("\n"))


@app.command()
def submit(
    name: str = NameArg,
    set_values: list[str] | None = typer.Option(
        None,
        "--set",
        metavar="NAME=VALUE",
        help="Template value, YAML-typed; several pairs may follow one flag.",
    ),
    set_strings: list[str] | None = SetStringOpt,
    set_env: list[str] | None = SetEnvOpt,
    pool: str | None = PoolOpt,
    priority: str | None = PriorityOpt,
    label: list[str] | None = LabelOpt,
    version: int | None = VersionOpt,
    local_path: Path | None = typer.Option(
        None,
        "--local-path",
        "-l",
        help="Read the spec's localpath files from this folder "
        "now, instead of the copies stored with the app version.",
    ),
    dry_run: bool = DryRunOpt,
    rsync: str | None = RsyncOpt,
    wait: bool = WaitOpt,
    fmt: Format = FormatOption,
) -> None:
    """Submit app NAME (or NAME:VERSION) as a workflow; print its id. JSON as `workflow
    submit`'s."""
    base, version = split_version(name, version)
    client = Client()
    files = (
        {}
        if local_path is None
        else files_under(
            local_path,
            _spec_of(name, version)["spec"],
            set_values=set_values or [],
            set_strings=set_strings or [],
        )
    )
    req = SpecBody(
        spec_text="",
        files=files,
        set=set_values or [],
        set_string=set_strings or [],
        set_env=set_env or [],
        pool=pool,
        labels=parse_labels(label or []),
        default_pool=profile_pool(),
        priority=checked_priority(priority),
    )
    params: dict[str, object] = {"dry_run": dry_run}
    if version:
        params["version"] = version
    data: SubmitAnswer | DryRunAnswer = client.json(
        "POST", f"/api/app/{_in_path(base)}/submit", params=params, json=req.to_json()
    )
    after_submit(client, data, fmt, dry_run=dry_run, wait=wait, rsync=rsync)


def _confirm(question: str, force: bool) -> None:
    """Ask ``question`` on a terminal unless ``force`` (OSMO asks before a delete or
    rename); a refusal ends the command (exit 1). Without a terminal nothing is asked."""
    if force or not sys.stdin.isatty():
        return
    if not typer.confirm(question, default=False):
        raise typer.Exit(1)


@app.command()
def delete(
    name: str = NameArg,
    all_versions: bool = typer.Option(False, "--all", "-a", help="Delete every version."),
    force: bool = ForceOpt,
    fmt: Format = FormatOption,
) -> None:
    """Delete an app version (its owner or an admin only): NAME:VERSION that one; NAME
    with --all every version; NAME alone: as osmo, its latest version; as trainyard, every
    version. JSON: {"name", "version", "deleted_versions"}."""
    from trainyard.cli.progname import by_program

    base, version = split_version(name, None)
    if version is None and not all_versions and by_program(True, False):
        latest: AppAnswer = Client().json("GET", f"/api/app/{_in_path(base)}")
        version = latest["version"]
    which = f"app {base} version {version}" if version else f"every version of app {base}"
    _confirm(f"Delete {which}?", force)
    data: AppDeletedAnswer = Client().json(
        "DELETE", f"/api/app/{_in_path(base)}", params={"version": version} if version else {}
    )
    emit(
        data,
        fmt,
        lambda d: console.print(
            f"App {d['name']} version {d['version']} deleted"
            if d.get("version")
            else f"App {d['name']} deleted ({d['deleted_versions']} versions)",
            markup=False,
        ),
    )


@app.command()
def rename(
    original_name: str = typer.Argument(..., metavar="ORIGINAL_NAME"),
    new_name: str = typer.Argument(..., metavar="NEW_NAME"),
    force: bool = ForceOpt,
) -> None:
    """Rename an app, every version of it (its owner or an admin only). A taken name is
    refused (exit 4)."""
    _confirm(f"Rename app {original_name} to {new_name}?", force)
    data: AppRenamedAnswer = Client().json(
        "POST", f"/api/app/{_in_path(original_name)}/rename", json={"new_name": new_name}
    )
    console.print(f"App {original_name} renamed to {data['name']}", markup=False)
