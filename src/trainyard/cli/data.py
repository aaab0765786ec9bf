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

from trainyard.cli.output import (
    Format,
    FormatOption,
    emit,
    err_console,
    human_bytes,
    rich_console,
    table,
)

if TYPE_CHECKING:
    from trainyard.data.transfer import Mover

# The data layer (fsspec and its protocols) is imported by the commands that use it, not when
# the command line starts: ``trainyard workflow submit`` never needs it.

__all__ = ["app", "mover_with_progress", "RegexOpt", "QuietOpt"]

STORAGE_HELP = (
    "Works directly against the storage, no server needed. URLs: file:// (or a local path), "
    "s3:// (endpoint from TRAINYARD_S3_ENDPOINT_URL, credentials from the AWS_* variables), "
    "and any other fsspec protocol whose package is installed."
)

app = typer.Typer(no_args_is_help=True, help=f"Files at storage URLs. {STORAGE_HELP}")

UrlArg = Annotated[str, typer.Argument(help="Storage URL (s3://bucket/prefix, file:///dir).")]
RegexOpt = Annotated[
    str | None,
    typer.Option(
        "--regex",
        "-x",
        help="Only files whose path relative to the folder or URL matches (re.search).",
    ),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")]


ProcessesOpt = Annotated[
    int | None,
    typer.Option(
        "--processes",
        "-p",
        min=1,
        help="OSMO's processes: with --threads, how many files move "
        "at once (processes x threads; default: the data "
        "settings' workers).",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option("--threads", "-T", min=1, help="OSMO's threads per process (see --processes)."),
]
BenchmarkOpt = Annotated[
    Path | None,
    typer.Option(
        "--benchmark-out",
        "-b",
        help="Write the transfer's numbers here as JSON: {\"files\", "
        "\"bytes\", \"seconds\", \"bytes_per_s\"}.",
    ),
]


def workers_of(processes: int | None, threads: int | None) -> int | None:
    """Files moved at once for OSMO's ``-p``/``-T`` (their product); None: the default."""
    if processes is None and threads is None:
        return None
    return (processes or 1) * (threads or 1)


@contextmanager
def mover_with_progress(quiet: bool, workers: int | None = None) -> Iterator[Mover]:
    """A ``Mover`` that draws a rich progress bar and prints its log lines on stderr;
    ``workers`` files at once (default: the data settings')."""
    from dataclasses import replace

    from trainyard.data.config import load_config
    from trainyard.data.progress import RichProgress
    from trainyard.data.transfer import Mover

    config = load_config()
    if workers is not None:
        config = replace(config, workers=workers)
    with RichProgress(rich_console(err_console), enabled=not quiet) as bar:
        log = None if quiet else (lambda line: err_console.print(line, markup=False))
        yield Mover(config=config, log=log, progress=bar)


def _benchmark(path: Path | None, files: int, size_bytes: int, started: float) -> None:
    """Write OSMO's ``--benchmark-out`` numbers of a transfer that began at ``started``."""
    if path is None:
        return
    import json
    import time

    seconds = max(time.monotonic() - started, 1e-9)
    path.write_text(
        json.dumps(
            {
                "files": files,
                "bytes": size_bytes,
                "seconds": seconds,
                "bytes_per_s": size_bytes / seconds,
            },
            indent=2,
        )
        + "\n"
    )


@app.command("upload")
def upload(
    url: UrlArg,
    paths: Annotated[
        list[str],
        typer.Argument(
            help="Files and folders. A folder keeps its name (DIR/a.txt) unless given as DIR/, "
            "which uploads its contents.",
            metavar="PATH...",
        ),
    ],
    regex: RegexOpt = None,
    processes: ProcessesOpt = None,
    threads: ThreadsOpt = None,
    benchmark_out: BenchmarkOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Upload local files and folders below URL (each file atomically)."""
    import time

    from trainyard.data import urls

    started = time.monotonic()
    with mover_with_progress(quiet, workers_of(processes, threads)) as mover:
        stats = urls.upload(url, paths, regex, mover)
    _benchmark(benchmark_out, stats.files, stats.bytes, started)
    typer.echo(f"uploaded {stats.files} file(s), {human_bytes(stats.bytes)} to {url}")


@app.command("download")
def download(
    url: UrlArg,
    dest: Annotated[Path, typer.Argument(help="Local folder (created).", metavar="DIR")],
    regex: RegexOpt = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            "-r",
            help="Keep the files DIR already has with the same size (an "
            "interrupted download goes on).",
        ),
    ] = False,
    processes: ProcessesOpt = None,
    threads: ThreadsOpt = None,
    benchmark_out: BenchmarkOpt = None,
    quiet: QuietOpt = False,
) -> None:
    """Download the files at URL into DIR (a checkpoint URL gives its last complete round)."""
    import time

    from trainyard.data import urls

    started = time.monotonic()
    with mover_with_progress(quiet, workers_of(processes, threads)) as mover:
        count = urls.download(url, dest, regex, mover, resume=resume)
    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    _benchmark(benchmark_out, count, size, started)
    typer.echo(f"downloaded {count} file(s) to {dest}")


def _head(rel: str) -> str:
    """What OSMO's listing without ``--recursive`` shows for a file: itself when it is
    right below the URL, else its first folder (``name/``)."""
    head, sep, _ = rel.partition("/")
    return head + sep


@app.command("list")
def list_files(
    url: UrlArg,
    local_path: Annotated[
        Path | None,
        typer.Argument(
            help="Also write the listing here, one path a line.", metavar="[LOCAL_PATH]"
        ),
    ] = None,
    regex: RegexOpt = None,
    prefix: Annotated[
        str | None,
        typer.Option("--prefix", "-p", help="Only paths (relative to URL) starting with this."),
    ] = None,
    recursive: Annotated[
        bool | None,
        typer.Option(
            "--recursive/--no-recursive",
            "-r",
            help="Every file below URL (trainyard's default); "
            "without it, as osmo, the files and folders right below URL.",
        ),
    ] = None,
    no_pager: Annotated[
        bool, typer.Option("--no-pager", help="OSMO's: never page (nothing is paged here).")
    ] = False,
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
    emit(
        rows,
        fmt,
        lambda data: table(
            ["path", "size"], [[r["path"], human_bytes(r["size_bytes"])] for r in data]
        ),
    )


@app.command("delete")
def delete(url: UrlArg, regex: RegexOpt = None, quiet: QuietOpt = False) -> None:
    """Delete the files at URL (those matching --regex): OSMO's `data delete`."""
    from trainyard.data import urls

    with mover_with_progress(quiet) as mover:
        count = urls.delete(url, regex, mover)
    typer.echo(f"deleted {count} file(s) at {url}")


ACCESS_TYPES = ("READ", "WRITE", "DELETE")
"""OSMO's ``data check --access-type`` choices."""


@app.command("check")
def check(
    url: UrlArg,
    access_type: Annotated[
        list[str] | None,
        typer.Option(
            "--access-type",
            "-a",
            metavar="READ|WRITE|DELETE",
            help="What to check (repeat for several; default: all three).",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config-file",
            "-c",
            help="Data settings to use instead of "
            "$TRAINYARD_HOME/data.yaml (TRAINYARD_DATA_CONFIG).",
        ),
    ] = None,
) -> None:
    """Check that URL can be read, written and deleted with the current settings and
    credentials (OSMO's `data check`): READ lists it, WRITE puts a small probe file, DELETE
    removes it. One line per check; exit 9 at the first that fails."""
    import uuid

    from trainyard.data.config import load_config
    from trainyard.data.transfer import Mover

    wanted = [a.upper() for a in access_type or ACCESS_TYPES]
    unknown = [a for a in wanted if a not in ACCESS_TYPES]
    if unknown:
        raise typer.BadParameter(
            f"{unknown[0]!r} is not one of {', '.join(ACCESS_TYPES)}", param_hint="'--access-type'"
        )
    mover = Mover(config=load_config(path=config_file))
    loc = mover.location(url)
    probe = loc.join(f".trainyard-check-{uuid.uuid4().hex}")
    steps = {
        "READ": lambda: mover.list_files(loc),
        "WRITE": lambda: mover.storage_call(
            f"write {probe}", lambda: loc.fs.pipe_file(probe, b"check\n")
        ),
        "DELETE": lambda: mover.storage_call(f"delete {probe}", lambda: loc.fs.rm_file(probe)),
    }
    if "DELETE" in wanted and "WRITE" not in wanted:
        steps["DELETE"] = lambda: (
            steps["WRITE"](),
            mover.storage_call(f"delete {probe}", lambda: loc.fs.rm_file(probe)),
        )
    for access in ACCESS_TYPES:
        if access in wanted:
            steps[access]()
            typer.echo(f"{access}: ok")
    if "WRITE" in wanted and "DELETE" not in wanted:
        mover.storage_call(f"delete {probe}", lambda: loc.fs.rm_file(probe))
