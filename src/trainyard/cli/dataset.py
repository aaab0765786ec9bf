"""``trainyard dataset``: named, versioned datasets (``osmo dataset``).

Works directly against the dataset store (``TRAINYARD_DATASET_URL``, default
``$TRAINYARD_HOME/datasets``; ``--store`` overrides), no server needed. Thin: each command
calls ``trainyard.data.DatasetStore``; errors are raised, never printed here.

Ownership: when a server is configured or runs (``cli.client.running_server_client``), the
store acts as the user of the CLI's token (``GET /api/whoami``): only a dataset's owner or an
admin may add versions, tag, delete or share it; others read only what is shared with them
(``dataset share``). Without a server nothing is checked (the files are the caller's own).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from trainyard.cli.data import STORAGE_HELP, QuietOpt, RegexOpt, mover_with_progress
from trainyard.cli.output import Format, FormatOption, emit, human_bytes, table
from trainyard.errors import DataError

if TYPE_CHECKING:
    from trainyard.data.datasets import Actor, DatasetInfo, DatasetStore, DatasetVersion
    from trainyard.data.transfer import Mover

# The data layer is imported when a dataset command runs, not when the command line starts
# (``trainyard workflow submit`` never needs fsspec).

__all__ = ["app"]

app = typer.Typer(
    no_args_is_help=True,
    help=(
        "Named datasets with numbered versions and tags; 'latest' is the newest complete version. "
        f"The store is TRAINYARD_DATASET_URL (default $TRAINYARD_HOME/datasets). {STORAGE_HELP}"
    ),
)

StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Dataset store URL (default: TRAINYARD_DATASET_URL).")
]
RefArg = Annotated[
    str,
    typer.Argument(
        help="NAME, NAME:VERSION or NAME:TAG (default latest).", metavar="NAME[:VERSION]"
    ),
]


def _actor() -> Actor | None:
    """The user of the CLI's token on the server it uses; None when no server is there."""
    from trainyard.cli.client import running_server_client  # only dataset commands need it
    from trainyard.data.datasets import Actor

    client = running_server_client()
    if client is None:
        return None
    who = client.json("GET", "/api/whoami")
    return Actor(str(who["user"]), bool(who["admin"]))


def _store(url: str | None, mover: Mover | None = None) -> DatasetStore:
    from trainyard.data.datasets import DatasetStore

    return DatasetStore(url, mover, actor=_actor())


def parse_ref(ref: str) -> tuple[str, str]:
    """``trainyard.data.datasets.parse_ref``, imported when first used."""
    from trainyard.data.datasets import parse_ref as parse

    return parse(ref)


def plan_uploads(paths: list[str], regex: str | None) -> Any:
    """``trainyard.data.transfer.plan_uploads``, imported when first used."""
    from trainyard.data.transfer import plan_uploads as plan

    return plan(paths, regex)


def _when(created_s: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created_s))


def _version_row(version: DatasetVersion, info: DatasetInfo) -> dict[str, Any]:
    return {
        "version": version.version,
        "tags": info.tags_of(version.version),
        "files": len(version.files),
        "size_bytes": version.size_bytes,
        "created_s": version.created_s,
    }


@app.command("list")
def list_datasets(store: StoreOpt = None, fmt: Format = FormatOption) -> None:
    """List datasets with their latest version."""
    datastore = _store(store)
    rows = []
    for name in datastore.names():
        info = datastore.info(name)
        latest = info.versions[-1]
        rows.append(
            {
                "name": name,
                "versions": len(info.versions),
                "latest": latest.version,
                "size_bytes": latest.size_bytes,
                "created_s": latest.created_s,
            }
        )
    emit(
        rows,
        fmt,
        lambda data: table(
            ["dataset", "versions", "latest", "size", "created"],
            [
                [
                    r["name"],
                    r["versions"],
                    r["latest"],
                    human_bytes(r["size_bytes"]),
                    _when(r["created_s"]),
                ]
                for r in data
            ],
        ),
    )


@app.command("info")
def info(
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    store: StoreOpt = None,
    fmt: Format = FormatOption,
) -> None:
    """Show a dataset's versions and tags."""
    details = _store(store).info(name)
    data = {
        "name": name,
        "tags": details.tags,
        "versions": [_version_row(v, details) for v in details.versions],
    }
    emit(
        data,
        fmt,
        lambda d: table(
            ["version", "tags", "files", "size", "created"],
            [
                [
                    r["version"],
                    ",".join(r["tags"]),
                    r["files"],
                    human_bytes(r["size_bytes"]),
                    _when(r["created_s"]),
                ]
                for r in d["versions"]
            ],
            title=f"dataset {name}",
        ),
    )


@app.command("upload")
def upload(
    name: Annotated[str, typer.Argument(help="Dataset name; NAME:TAG also tags the new version.")],
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files and folders. A folder keeps its name (DIR/a.txt) unless given as DIR/, "
            "which uploads its contents.",
            metavar="PATH...",
        ),
    ],
    regex: RegexOpt = None,
    store: StoreOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Upload files as a new version (it appears only once every file is stored)."""
    dataset, selector = parse_ref(name)
    tag = selector if ":" in name else None
    files = plan_uploads(paths, regex)
    if not files:
        raise DataError(f"nothing to upload: no file under {', '.join(paths)} matches")
    with mover_with_progress(quiet) as mover:
        version = _store(store, mover).upload(dataset, files, tag)
    typer.echo(
        f"dataset {dataset} version {version.version}: {len(version.files)} file(s), "
        f"{human_bytes(version.size_bytes)}"
    )


@app.command("download")
def download(
    ref: RefArg,
    dest: Annotated[Path, typer.Argument(help="Local folder (created).", metavar="DIR")],
    path: Annotated[
        str | None, typer.Option("--path", help="A file or folder inside the dataset.")
    ] = None,
    regex: RegexOpt = None,
    store: StoreOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Download a version into DIR, checking every file's sha256."""
    with mover_with_progress(quiet) as mover:
        version, stats = _store(store, mover).download(ref, dest, path, regex)
    typer.echo(
        f"dataset {version.name} version {version.version}: "
        f"downloaded {stats.files} file(s) to {dest}"
    )


@app.command("delete")
def delete(
    ref: Annotated[
        str,
        typer.Argument(
            help="NAME (every version) or NAME:VERSION / NAME:TAG.", metavar="NAME[:VERSION]"
        ),
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    store: StoreOpt = None,
) -> None:
    """Delete one version, or the whole dataset. A deleted version number is never reused."""
    name, selector = parse_ref(ref)
    what = (
        f"version {selector} of dataset {name}" if ":" in ref else f"dataset {name} (every version)"
    )
    if not yes:
        typer.confirm(f"Delete {what}?", abort=True)
    deleted = _store(store).delete(name, selector if ":" in ref else None)
    typer.echo(f"deleted {name} version(s) {', '.join(map(str, deleted))}")


@app.command("tag")
def tag(
    ref: Annotated[
        str, typer.Argument(help="NAME:VERSION (or NAME:TAG) to tag.", metavar="NAME:VERSION")
    ],
    new_tag: Annotated[
        str, typer.Argument(help="The tag (not a number, not 'latest').", metavar="TAG")
    ],
    store: StoreOpt = None,
) -> None:
    """Point TAG at a version (moving it if it named another)."""
    name, selector = parse_ref(ref)
    version = _store(store).tag(name, selector, new_tag)
    typer.echo(f"{name}:{new_tag} -> version {version.version}")


@app.command("share")
def share(
    name: Annotated[str, typer.Argument(help="Dataset name.")],
    user: Annotated[str | None, typer.Option("--user", help="The user who may read it.")] = None,
    everyone: Annotated[bool, typer.Option("--everyone", help="Every user may read it.")] = False,
    remove: Annotated[bool, typer.Option("--remove", help="Stop sharing with them.")] = False,
    store: StoreOpt = None,
    fmt: Format = FormatOption,
) -> None:
    """Let another user (or everyone) read a dataset; only its owner or an admin may."""
    if (user is None) == (not everyone):
        raise typer.BadParameter("give exactly one of --user USER or --everyone")
    from trainyard.data.datasets import EVERYONE

    who = EVERYONE if everyone else str(user).strip()
    if not who or who == EVERYONE:
        raise typer.BadParameter(f"--user needs a user name (use --everyone for {EVERYONE!r})")
    acl = _store(store).share(name, who, remove=remove)
    emit(
        acl,
        fmt,
        lambda d: typer.echo(
            f"dataset {name}: owner {d['owner']}; readers: {', '.join(d['readers']) or 'none'}"
        ),
    )
