"""The ``trainyard`` command: one typer app, one sub-app per command group.

``main()`` is the entry point (console script ``trainyard``). It is the one place that prints
errors: every ``TrainyardError`` a command raises is printed once to stderr and turned into
its ``exit_code``; usage errors are printed by click with its code (2).

Adding a command group: write ``cli/<group>.py`` with a ``typer.Typer`` named ``app`` and
add ``"<group>"`` to ``SUBAPPS``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import typer

from trainyard import __version__
from trainyard.errors import SpecError, TrainyardError

__all__ = ["app", "main", "SUBAPPS", "MULTI_VALUE_FLAGS", "expand_multi_value_flags"]

SUBAPPS: tuple[str, ...] = ("workflow", "app", "pool", "resource", "server", "dataset", "data")
"""Command groups, each a module ``trainyard.cli.<name>`` exposing ``app``."""

MULTI_VALUE_FLAGS = frozenset({"--set", "--set-string", "--set-env", "--label"})
"""Flags that take several ``NAME=VALUE`` pairs after one flag (``--set a=1 b=2``)."""

app = typer.Typer(
    name="trainyard",
    help="Run NVIDIA OSMO workflow specs on this machine, Slurm or Kubernetes.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@app.command()
def version() -> None:
    """Print trainyard's version, and the server's when one answers (never starts one)."""
    from trainyard.cli.client import server_version

    typer.echo(f"trainyard {__version__}")
    server = server_version()
    if server is not None:
        typer.echo(f"server {server[1]} at {server[0]}")


def _register_subapps() -> None:
    for name in SUBAPPS:
        module = importlib.import_module(f"trainyard.cli.{name}")
        app.add_typer(module.app, name=name)


_register_subapps()


def expand_multi_value_flags(argv: Sequence[str]) -> list[str]:
    """Repeat a multi-value flag before each of its pairs: ``--set a=1 b=2`` becomes
    ``--set a=1 --set b=2``. A pair is a word with ``=`` that is not an option."""
    out: list[str] = []
    flag: str | None = None
    for word in argv:
        if word in MULTI_VALUE_FLAGS:
            flag = word
        elif flag and "=" in word and not word.startswith("-") and out[-1] != flag:
            out.append(flag)
        elif not (flag and "=" in word and not word.startswith("-")):
            flag = None
        out.append(word)
    return out


def print_error(exc: TrainyardError) -> None:
    """Write an error to stderr: one line per spec problem, else ``error: message``."""
    if isinstance(exc, SpecError):
        for problem in exc.problems:
            typer.echo(str(problem), err=True)
    else:
        typer.echo(f"error: {exc}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the process exit status.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        0 on success, a ``TrainyardError``'s ``exit_code``, or click's status (2 for a
        usage error).
    """
    args = expand_multi_value_flags(sys.argv[1:] if argv is None else argv)
    command = typer.main.get_command(app)
    try:
        command.main(args=args, prog_name="trainyard", standalone_mode=True)
    except TrainyardError as exc:
        print_error(exc)
        return exc.exit_code
    except SystemExit as exc:  # click ends every standalone run this way, usage errors too
        return _exit_status(exc.code)
    return 0


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
