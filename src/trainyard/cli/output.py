"""How the CLI prints: tables for people (rich), ``-t/--format-type json`` for scripts.

rich is imported when something is first printed through ``console`` or ``err_console`` (or
a ``table``), not when a command starts: it costs the start time, and a
plain line needs none of it (``typer.echo``). A line of plain text (or with only ``[dim]``
markup) printed into a pipe or a file, where rich writes no styles, is written without
rich at all (``_LazyConsole.print``): ``submit --wait`` printed its first progress line,
and imported rich (13-18 ms of CPU), while the gang it had just submitted was starting.
"""

from __future__ import annotations

import json
import os
import re
import sys
import unicodedata
from datetime import UTC
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import typer

from trainyard.errors import SpecProblem

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "Format",
    "FormatOption",
    "LongFormatOption",
    "console",
    "err_console",
    "rich_console",
    "emit",
    "table",
    "printable",
    "human_bytes",
    "short_time",
    "spec_warnings",
    "print_spec_warnings",
]


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

    def print(self, *objects: Any, **options: Any) -> None:
        """``Console.print``; a plain line into a pipe or file before rich is needed is
        written as rich would write it, without importing rich (``plain_line``)."""
        same = {k: v for k, v in options.items() if (k, v) not in _DEFAULT_OPTIONS}
        if self._console is None and len(objects) == 1 and set(same) <= {"markup", "emoji"}:
            line = plain_line(
                objects[0], markup=same.get("markup", True), emoji=same.get("emoji", True)
            )
            stream = sys.stderr if self._options.get("stderr") else sys.stdout
            if line is not None and not _styled(stream):
                stream.write(line + "\n")
                stream.flush()
                return
        self._real().print(*objects, **options)


_DEFAULT_OPTIONS = {("highlight", False), ("soft_wrap", True)}
"""``print`` options that change nothing for this module's consoles (made so)."""

_DIMMED = re.compile(r"\[dim\]([^\[\]\\]*)\[/dim\](.*)", re.DOTALL)  # [dim]X[/dim]Y
_EMOJI_CODE = re.compile(r":\S*?:")  # what rich's emoji codes look like (``:smile:``)


def plain_line(text: Any, *, markup: bool = True, emoji: bool = True) -> str | None:
    """What a console of this module (no highlighting, soft wrap) writes for ``text`` where
    it writes no styles: the text without its one leading ``[dim]...[/dim]``. None when rich
    must decide: not a ``str``, other markup or brackets, a backslash in markup, a colon
    pair that could be an emoji code (unless ``emoji`` is False: a time such as
    ``03:10:29`` has one), a tab, a line break or another character that is not
    printable."""
    if not isinstance(text, str):
        return None
    plain = text
    if markup:
        dimmed = _DIMMED.fullmatch(text)
        plain = "".join(dimmed.groups()) if dimmed else text
        if "\\" in plain:  # a backslash escapes markup
            return None
    if (
        "[" in plain
        or "]" in plain
        or (emoji and _EMOJI_CODE.search(plain))
        or not plain.isprintable()
    ):
        return None
    return plain


def _styled(stream: Any) -> bool:
    """Whether rich would treat ``stream`` as a terminal (``Console.is_terminal``: the
    ``TTY_COMPATIBLE`` and ``FORCE_COLOR`` variables, else ``isatty``)."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    if "FORCE_COLOR" in os.environ:
        return os.environ["FORCE_COLOR"] != ""
    isatty = getattr(stream, "isatty", None)
    try:
        return True if isatty is None else bool(isatty())
    except ValueError:
        return True


console = cast("Console", _LazyConsole(highlight=False, soft_wrap=True))
err_console = cast("Console", _LazyConsole(stderr=True, highlight=False, soft_wrap=True))


def rich_console(view: Console) -> Console:
    """The real ``rich.console.Console`` of ``console`` or ``err_console`` (made now), for a
    rich API that takes one (a progress bar: its ``Live`` display enters the console); any
    other console as it is. Printing needs none: ``console.print`` works as it is."""
    return view._real() if isinstance(view, _LazyConsole) else view


class Format(StrEnum):
    """An output format: OSMO's ``text`` and ``json`` (``-t/--format-type``); ``table`` is
    trainyard's older name of ``text`` and means the same."""

    text = "text"
    json = "json"
    table = "table"

    @property
    def human(self) -> bool:
        """Whether this is the format for people (``text`` or ``table``)."""
        return self is not Format.json


FORMAT_HELP = "text (tables) for people, json for scripts (table: the same as text)"

FormatOption = typer.Option(Format.text, "--format-type", "-t", "--format", help=FORMAT_HELP)
"""``-t/--format-type json|text`` as OSMO's CLI spells it; ``--format`` kept as a long alias.
``-f`` never means format: OSMO gives it to ``--offset``, ``--force`` and ``--file``."""

LongFormatOption = typer.Option(Format.text, "--format-type", "--format", help=FORMAT_HELP)
"""The format option of the commands where ``-t`` is OSMO's ``--task`` (``workflow logs``,
``workflow events``): long names only."""


def emit(data: Any, fmt: Format, render_table: Any) -> None:
    """Print ``data`` as JSON, or call ``render_table(data)`` for people."""
    if fmt is Format.json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        render_table(data)


_UNSEEN = ("Cc", "Cf", "Zl", "Zp")
"""Unicode categories that move, hide or reorder text on a terminal (control, format such
as U+202E, line and paragraph separators)."""


def printable(text: str) -> str:
    """``text`` with every control, format or separator character written as its Python
    escape (``\\x01``, ``\\u202e``), so a stored name cannot forge or reorder a row."""
    if text.isprintable():
        return text
    return "".join(ascii(c)[1:-1] if unicodedata.category(c) in _UNSEEN else c for c in text)


def table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    """Print a simple table: a rule under the header, columns two spaces apart, no frame
    (so the usual tables fit 80 columns). No cell is cut short: on a terminal long cells
    wrap; into a pipe or file the table takes the width it needs, one line per row (ids
    stay whole for grep)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = Table(
        title=title,
        show_lines=False,
        header_style="bold",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
        title_justify="left",
    )
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*["" if v is None else printable(str(v)) for v in row])
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
    """An ISO 8601 UTC time as ``YYYY-MM-DD HH:MM:SS`` (UTC, seconds: the one format of the
    CLI and the dashboard; without ``date``: ``HH:MM:SS``, for a table of one day's times);
    ``-`` for none. JSON output keeps the full ISO time."""
    if not iso_time:
        return "-"
    from datetime import datetime

    try:
        when = datetime.fromisoformat(iso_time).astimezone(UTC)
    except ValueError:
        return iso_time
    return when.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")


def spec_warnings(data: Any) -> list[SpecProblem]:
    """The spec warnings of a server answer (its ``"warnings"`` rows; none when absent)."""
    rows = data.get("warnings") if isinstance(data, dict) else None
    return [SpecProblem(**row) for row in rows or [] if isinstance(row, dict)]


def print_spec_warnings(warnings: list[SpecProblem]) -> None:
    """One line per spec warning on stderr (``file:line: warning: path: message``), whatever
    the format: stdout stays the command's output."""
    for warning in warnings:
        typer.echo(warning.warning_text(), err=True)
