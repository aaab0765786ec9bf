"""The ``trainyard`` command: one typer app, one sub-app per command group.

``main()`` is the entry point (console script ``trainyard``). It is the one place that prints
errors: every ``TrainyardError`` a command raises is printed once to stderr and turned into
its ``exit_code``; usage errors are printed by click with its code (2). ``EXIT_CODES`` is the
table of those codes, shown by ``trainyard --help``; errors the server raises come back as
the same classes (``cli.client``), so they exit with the same codes.

Adding a command group: write ``cli/<group>.py`` with a ``typer.Typer`` named ``app`` and
add ``"<group>"`` to ``SUBAPPS``.

Command groups are imported only when needed (issue 15): ``main()`` builds the app with the one
group its command line names first (``trainyard workflow submit ...`` imports
``cli.workflow`` and nothing of ``dataset``, ``pool``, ...), and of that group only the
command it names next (typer builds no other); with every group and command when it names
none (``trainyard --help``, shell completion, an unknown command: each lists every one).
``app`` (every group) is built on first access, for tests and tools that inspect the tree.
Values of the simple types are converted without pydantic (``cli.lean_typer``).

``main()`` imports typer and the group, and builds the command, with the cyclic garbage
collector paused (``collector_paused``): those imports make tens of thousands of objects that
live as long as the process, and collecting them again and again (~60 collections) cost the
start ~8 ms of ~110 (issue 15). The console script then freezes them (``gc.freeze``), so no
later collection walks them either. This module itself imports no typer for that reason.
"""

from __future__ import annotations

import copy
import gc
import importlib
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

from trainyard import __version__
from trainyard.errors import SpecError, TrainyardError

if TYPE_CHECKING:  # imported by the functions that use it, in main's collector pause
    import typer

__all__ = ["app", "main", "exit_now", "build_app", "groups_for", "command_for", "SUBAPPS",
           "MULTI_VALUE_FLAGS", "EXIT_CODES", "expand_multi_value_flags", "collector_paused"]

SUBAPPS: tuple[str, ...] = ("workflow", "task", "app", "pool", "resource", "server", "dataset",
                            "data", "credential")
"""Command groups, each a module ``trainyard.cli.<name>`` exposing ``app``."""

MULTI_VALUE_FLAGS = frozenset({"--set", "--set-string", "--set-env", "--label", "--payload",
                               "--payload-file"})
"""Flags that take several ``NAME=VALUE`` pairs after one flag (``--set a=1 b=2``)."""

EXIT_CODES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (1, "--wait: the workflow ended other than COMPLETED; an unexpected error"),
    (2, "usage error, or a spec refused (one line per problem)"),
    (3, "not found: workflow, task, pool, app, dataset"),
    (4, "request refused: e.g. restart of a running or COMPLETED workflow"),
    (5, "a backend (local, Slurm, Kubernetes) failed"),
    (6, "the store failed"),
    (7, "server unreachable or failed"),
    (8, "authentication: no or a wrong token (401), or not yours (403)"),
    (9, "a data transfer to or from storage failed"),
)
"""Stable exit codes: one per error class of ``trainyard.errors`` (the class's ``exit_code``)."""

_EXIT_TABLE = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES)

if TYPE_CHECKING:
    app: typer.Typer
    """Every command group and ``version`` (built on first access: ``__getattr__``)."""


@contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """Pause the cyclic garbage collector for the block (imports, building the command:
    objects that live as long as the process), then leave it as it was found. With
    ``freeze`` (the console script only: a test process calling ``main`` keeps its heap
    collectable), what exists at the end of the block is moved out of reach of later
    collections (``gc.freeze``) before the collector runs again, so the first one does not
    walk them all (~3 ms)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was_enabled:
            gc.enable()


def version() -> None:
    """Print trainyard's version, and the server's when one answers (never starts one)."""
    import typer

    from trainyard.cli.client import server_version

    typer.echo(f"trainyard {__version__}")
    server = server_version()
    if server is not None:
        typer.echo(f"server {server[1]} at {server[0]}")


def build_app(groups: Sequence[str] = SUBAPPS, command: str | None = None) -> typer.Typer:
    """The ``trainyard`` typer app: ``version`` and the command groups of ``groups`` (each
    imported now, in ``SUBAPPS`` order; give at least one, or typer makes ``version`` the
    whole program). With ``command``, a group that has a command of that name holds only
    it (``workflow submit``: typer builds none of the other ~20); one that has none keeps
    all its commands (click then names the unknown one and lists them)."""
    import typer

    root = typer.Typer(
        name="trainyard",
        help="Run NVIDIA OSMO workflow specs on this machine, Slurm or Kubernetes.",
        epilog=f"\b\nExit codes:\n{_EXIT_TABLE}",
        no_args_is_help=True,
        add_completion=True,
        pretty_exceptions_enable=False,
    )
    root.command()(version)
    root.command()(importlib.import_module("trainyard.cli.dashboard").dashboard)
    for name in SUBAPPS:
        if name in groups:
            group = importlib.import_module(f"trainyard.cli.{name}").app
            root.add_typer(_only_command(group, command), name=name)
    return root


def _command_name(info: typer.models.CommandInfo) -> str:
    import typer

    return info.name or typer.main.get_command_name(info.callback.__name__)  # typer's rule


def _only_command(group: typer.Typer, command: str | None) -> typer.Typer:
    """``group`` with only its command named ``command``; ``group`` itself when it has none
    of that name (or ``command`` is None)."""
    if command is None:
        return group
    chosen = [info for info in group.registered_commands
              if info.callback is not None and _command_name(info) == command]
    if not chosen:
        return group
    narrowed = copy.copy(group)  # the group's own lists stay as they are
    narrowed.registered_commands = chosen
    return narrowed


def groups_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The command groups a command line needs: the group it names first (its first word),
    else every group (``--help``, completion, ``version``, an unknown or no command, so
    that click lists them all)."""
    if argv and argv[0] in SUBAPPS:
        return (argv[0],)
    return SUBAPPS


def command_for(argv: Sequence[str]) -> str | None:
    """The command a command line names in its group (its second word, after a group's
    name), else None (every command of the group is built)."""
    if len(argv) > 1 and argv[0] in SUBAPPS and not argv[1].startswith("-"):
        return argv[1]
    return None


def __getattr__(name: str) -> typer.Typer:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = build_app()
    globals()["app"] = built
    return built


def expand_multi_value_flags(argv: Sequence[str]) -> list[str]:
    """Repeat a multi-value flag before each of its pairs: ``--set a=1 b=2`` becomes
    ``--set a=1 --set b=2``. A pair is a word with ``=`` that is not an option. Nothing
    after ``--`` is touched."""
    out: list[str] = []
    flag: str | None = None
    for index, word in enumerate(argv):
        if word == "--":  # the rest is a command's own (``workflow exec ID TASK -- CMD``)
            return out + list(argv[index:])
        if word in MULTI_VALUE_FLAGS:
            flag = word
        elif flag and "=" in word and not word.startswith("-") and out[-1] != flag:
            out.append(flag)
        elif not (flag and "=" in word and not word.startswith("-")):
            flag = None
        out.append(word)
    return out


def print_error(exc: TrainyardError) -> None:
    """Write an error to stderr: one line per spec problem (then one per warning), else
    ``error: message``."""
    import typer

    if isinstance(exc, SpecError):
        for problem in exc.problems:
            typer.echo(str(problem), err=True)
        for warning in exc.warnings:
            typer.echo(warning.warning_text(), err=True)
    else:
        typer.echo(f"error: {exc}", err=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the process exit status.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
        0 on success, a ``TrainyardError``'s ``exit_code``, or click's status (2 for a
        usage error). With ``argv`` None (the console script) it does not return: the
        process ends with that status (``exit_now``).
    """
    status = _run(sys.argv[1:] if argv is None else argv, freeze=argv is None)
    if argv is None:  # the console script: nothing runs after the command
        exit_now(status)
    return status


def _run(argv: Sequence[str], *, freeze: bool = False) -> int:
    args = expand_multi_value_flags(argv)
    with collector_paused(freeze=freeze):  # typer and the group's imports (httpx...)
        import typer

        from trainyard.cli.lean_typer import use_plain_conversion

        command = typer.main.get_command(build_app(groups_for(args), command_for(args)))
        use_plain_conversion(command)  # str, bool, list[str] and choices: without pydantic
    try:
        command.main(args=args, prog_name="trainyard", standalone_mode=True)
    except TrainyardError as exc:
        print_error(exc)
        return exc.exit_code
    except SystemExit as exc:  # click ends every standalone run this way, usage errors too
        return _exit_status(exc.code)
    return 0


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` once the command is done: stdout, stderr and logging
    flushed, then ``os._exit`` without the interpreter's teardown of every loaded module
    (80-250 ms on a loaded 2-core machine, after ``--wait`` already saw the end; issue 15).
    Only ``main()`` as the console script calls it; in-process callers get the status."""
    import logging
    import os

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`) or stream: nothing to keep
            pass
    os._exit(status)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
