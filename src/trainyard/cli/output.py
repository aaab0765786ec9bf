"""How the CLI prints: tables for people (rich), ``--format json`` for scripts.

rich is imported when something is first printed through ``console`` or ``err_console`` (or
a ``table``), not when a command starts: it costs the start about 13 ms (issue 15), and a
plain line needs none of it (``typer.echo``).
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import typer

from trainyard.errors import SpecProblem

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["Format", "FormatOption", "console", "err_console", "rich_console", "emit", "table",
           "human_bytes", "short_time", "spec_warnings", "print_spec_warnings"]


class _LazyConsole:
    """A ``rich.console.Console`` made (and rich imported) on first use; every attribute is
    the real console's."""

    def __init__(self, **options: Any) -> None:
        self._options = options
        self._console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._options)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)


console = cast("Console", _LazyConsole(highlight=False, soft_wrap=True))
err_console = cast("Console", _LazyConsole(stderr=True, highlight=False, soft_wrap=True))


def rich_console(view: Console) -> Console:
    """The real ``rich.console.Console`` of ``console`` or ``err_console`` (made now), for a
    rich API that takes one (a progress bar: its ``Live`` display enters the console); any
    other console as it is. Printing needs none: ``console.print`` works as it is."""
    return view._real() if isinstance(view, _LazyConsole) else view


class Format(StrEnum):
    table = "table"
    json = "json"


FormatOption = typer.Option(Format.table, "--format", "-f", help="table for people, json for scripts")


def emit(data: Any, fmt: Format, render_table: Any) -> None:
    """Print ``data`` as JSON, or call ``render_table(data)`` for people."""
    if fmt is Format.json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        render_table(data)


def table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """Print a simple table: a rule under the header, columns two spaces apart, no frame
    (so the usual tables fit 80 columns). No cell is cut short: on a terminal long cells
    wrap; into a pipe or file the table takes the width it needs, one line per row (ids
    stay whole for grep)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = Table(title=title, show_lines=False, header_style="bold", box=box.SIMPLE_HEAD,
                show_edge=False, padding=(0, 1, 0, 0), title_justify="left")
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*["" if v is None else str(v) for v in row])
    if console.is_terminal:
        console.print(out)
        return
    natural = console.measure(out, options=console.options.update_width(10_000)).maximum
    width = max(console.width, natural)
    Console(file=console.file, width=width, highlight=False, soft_wrap=True).print(out)


def human_bytes(value: float) -> str:
    """A size in the one format every CLI table and message uses: binary units, three
    significant digits, ``B`` always: ``1073741824`` -> ``1GiB``, ``1536`` -> ``1.5KiB``,
    ``12`` -> ``12B``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}B"


def short_time(iso_time: str | None, *, date: bool = True) -> str:
    """An ISO 8601 UTC time as ``MM-DD HH:MM:SS`` (UTC; without ``date``: ``HH:MM:SS``),
    for tables that fit 80 columns; ``-`` for none. JSON output keeps the full ISO time."""
    if not iso_time:
        return "-"
    from datetime import datetime, timezone

    try:
        when = datetime.fromisoformat(iso_time).astimezone(timezone.utc)
    except ValueError:
        return iso_time
    return when.strftime("%m-%d %H:%M:%S" if date else "%H:%M:%S")


def spec_warnings(data: Any) -> list[SpecProblem]:
    """The spec warnings of a server answer (its ``"warnings"`` rows; none when absent)."""
    rows = data.get("warnings") if isinstance(data, dict) else None
    return [SpecProblem(**row) for row in rows or [] if isinstance(row, dict)]


def print_spec_warnings(warnings: list[SpecProblem]) -> None:
    """One line per spec warning on stderr (``file:line: warning: path: message``), whatever
    the format: stdout stays the command's output."""
    for warning in warnings:
        typer.echo(warning.warning_text(), err=True)
