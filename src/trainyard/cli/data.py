"""``trainyard data``: upload, download and list files at a storage URL (``osmo data``).

Works directly against the storage (no server needed). Thin: each command calls
``trainyard.data.urls`` with a ``Mover`` that draws a progress bar on stderr; errors are
raised, never printed here (``cli.main`` prints them).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from trainyard.cli.output import (Format, FormatOption, emit, err_console, human_bytes,
                                  rich_console, table)

if TYPE_CHECKING:
    from trainyard.data.transfer import Mover

# The data layer (fsspec and its protocols) is imported by the commands that use it, not when
# the command line starts: ``trainyard workflow submit`` never needs it (issue 15).

__all__ = ["app", "mover_with_progress", "RegexOpt", "QuietOpt"]

STORAGE_HELP = (
    "Works directly against the storage, no server needed. URLs: file:// (or a local path), "
    "s3:// (endpoint from TRAINYARD_S3_ENDPOINT_URL, credentials from the AWS_* variables), "
    "and any other fsspec protocol whose package is installed.")

app = typer.Typer(no_args_is_help=True, help=f"Files at storage URLs. {STORAGE_HELP}")

UrlArg = Annotated[str, typer.Argument(help="Storage URL (s3://bucket/prefix, file:///dir).")]
RegexOpt = Annotated[str | None, typer.Option(
    "--regex", "-x", help="Only files whose path relative to the folder or URL matches (re.search).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")]


@contextmanager
def mover_with_progress(quiet: bool) -> Iterator[Mover]:
    """A ``Mover`` that draws a rich progress bar and prints its log lines on stderr."""
    from trainyard.data.progress import RichProgress
    from trainyard.data.transfer import Mover

    with RichProgress(rich_console(err_console), enabled=not quiet) as bar:
        log = None if quiet else (lambda line: err_console.print(line, markup=False))
        yield Mover(log=log, progress=bar)


@app.command("upload")
def upload(
    url: UrlArg,
    paths: Annotated[list[str], typer.Argument(
        help="Files and folders. A folder keeps its name (DIR/a.txt) unless given as DIR/, "
             "which uploads its contents.", metavar="PATH...")],
    regex: RegexOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Upload local files and folders below URL (each file atomically)."""
    from trainyard.data import urls

    with mover_with_progress(quiet) as mover:
        stats = urls.upload(url, paths, regex, mover)
    typer.echo(f"uploaded {stats.files} file(s), {human_bytes(stats.bytes)} to {url}")


@app.command("download")
def download(
    url: UrlArg,
    dest: Annotated[Path, typer.Argument(help="Local folder (created).", metavar="DIR")],
    regex: RegexOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Download the files at URL into DIR (a checkpoint URL gives its last complete round)."""
    from trainyard.data import urls

    with mover_with_progress(quiet) as mover:
        count = urls.download(url, dest, regex, mover)
    typer.echo(f"downloaded {count} file(s) to {dest}")


def _head(rel: str) -> str:
    """What OSMO's listing without ``--recursive`` shows for a file: itself when it is
    right below the URL, else its first folder (``name/``)."""
    head, sep, _ = rel.partition("/")
    return head + sep


@app.command("list")
def list_files(
    url: UrlArg,
    local_path: Annotated[Path | None, typer.Argument(
        help="Also write the listing here, one path a line.", metavar="[LOCAL_PATH]")] = None,
    regex: RegexOpt = None,
    prefix: Annotated[str | None, typer.Option(
        "--prefix", "-p", help="Only paths (relative to URL) starting with this.")] = None,
    recursive: Annotated[bool | None, typer.Option(
        "--recursive/--no-recursive", "-r", help="Every file below URL (trainyard's default); "
        "without it, as osmo, the files and folders right below URL.")] = None,
    no_pager: Annotated[bool, typer.Option("--no-pager", help="OSMO's: never page (nothing "
                                           "is paged here).")] = False,
    fmt: Format = FormatOption,
) -> None:
    """List the files at URL with their sizes. JSON: a list of {"path", "size_bytes"}
    (without --recursive under osmo: folders as "name/" with the size of what they hold)."""
    from trainyard.cli.progname import by_program
    from trainyard.data import urls

    files = [f for f in urls.list_url(url, regex) if f.rel.startswith(prefix or "")]
    if recursive if recursive is not None else by_program(False, True):
        rows = [{"path": f.rel, "size_bytes": f.size} for f in files]
    else:
        sizes: dict[str, int] = {}
        for f in files:
            head = _head(f.rel)
            sizes[head] = sizes.get(head, 0) + f.size
        rows = [{"path": path, "size_bytes": size} for path, size in sizes.items()]
    if local_path is not None:
        local_path.write_text("".join(f"{r['path']}\n" for r in rows))
    emit(rows, fmt, lambda data: table(["path", "size"], [[r["path"], human_bytes(r["size_bytes"])]
                                                           for r in data]))


@app.command("delete")
def delete(url: UrlArg, regex: RegexOpt = None, quiet: QuietOpt = False) -> None:
    """Delete the files at URL (those matching --regex): OSMO's `data delete`."""
    from trainyard.data import urls

    with mover_with_progress(quiet) as mover:
        count = urls.delete(url, regex, mover)
    typer.echo(f"deleted {count} file(s) at {url}")
