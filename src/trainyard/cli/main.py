"""The ``trainyard`` command: one typer app, one sub-app per command group.

``main()`` is the entry point (console script ``trainyard``) and the one place that prints
errors: every ``TrainyardError`` is printed once to stderr and turned into its ``exit_code``;
usage errors exit 2 (click). ``EXIT_CODES`` is the table shown by ``trainyard --help``; errors
the server raises come back as the same classes (``cli.client``), so exit with the same codes.
Adding a command group: write ``cli/<group>.py`` with a ``typer.Typer`` named ``app`` and add
``"<group>"`` to ``SUBAPPS``. Groups and commands are imported only when their command line
names them; ``app`` (every group) is built on first access. Start-up details:
docs/architecture.md, "The CLI's start".
"""

from __future__ import annotations

import copy
import gc
import importlib
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, NoReturn

from trainyard.errors import SpecError, TrainyardError

if TYPE_CHECKING:  # imported by the functions that use it, in main's collector pause
    import typer

__all__ = [
    "app",
    "main",
    "exit_now",
    "build_app",
    "groups_for",
    "command_for",
    "SUBAPPS",
    "command_words",
    "program_name",
    "GLOBAL_OPTIONS",
    "LOG_LEVELS",
    "MULTI_VALUE_FLAGS",
    "NARGS_FLAGS",
    "EXIT_CODES",
    "expand_multi_value_flags",
    "collector_paused",
]

SUBAPPS: tuple[str, ...] = (
    "workflow",
    "task",
    "app",
    "pool",
    "resource",
    "server",
    "dataset",
    "data",
    "credential",
    "profile",
    "token",
    "user",
)
"""Command groups, each a module ``trainyard.cli.<name>`` exposing ``app``."""

TOP_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("login", "trainyard.cli.session", "login"),
    ("logout", "trainyard.cli.session", "logout"),
)
"""Commands outside any group (OSMO's ``login`` and ``logout``): name, module, function."""

MULTI_VALUE_FLAGS = frozenset(
    {"--set", "--set-string", "--set-env", "--label", "--payload", "--payload-file"}
)
"""Flags that take several ``NAME=VALUE`` pairs after one flag (``--set a=1 b=2``)."""

NARGS_FLAGS: dict[tuple[str, str], frozenset[str]] = {
    ("workflow", "list"): frozenset(
        {"--status", "-s", "--user", "-u", "--pool", "-p", "--tags", "--priority"}
    ),
    ("workflow", "tag"): frozenset({"--workflow", "-w", "--add", "-a", "--remove", "-r"}),
    ("task", "list"): frozenset(
        {"--status", "-s", "--user", "-u", "--pool", "-p", "--node", "-n", "--priority"}
    ),
    ("app", "list"): frozenset({"--user", "-u"}),
    ("pool", "list"): frozenset({"--pool", "-p"}),
    ("resource", "list"): frozenset({"--pool", "-p", "--platform"}),
    ("token", "set"): frozenset({"--roles", "-r"}),
    ("user", "list"): frozenset({"--roles", "-r"}),
    ("user", "create"): frozenset({"--roles", "-r"}),
    ("user", "update"): frozenset({"--add-roles", "-a", "--remove-roles", "-r"}),
}
"""Per command, the flags that OSMO's CLI (argparse ``nargs='+'``) lets take several values
after one flag (``workflow list -s RUNNING FAILED``): every word up to the next option is
one of its values."""

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


class LogLevel(StrEnum):
    """``--log-level`` choices: Python's logging levels, as OSMO's CLI takes them."""

    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    CRITICAL = "CRITICAL"


LOG_LEVELS = tuple(level.value for level in LogLevel)


def _global_options(log_level: str = "WARNING") -> None:
    """Options of every command (OSMO's ``--log-level``), given before the command."""
    import logging

    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")


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
    root.callback()(_log_level_callback())
    root.command("version")(importlib.import_module("trainyard.cli.version").version)
    for name, module, function in TOP_COMMANDS:
        root.command(name)(getattr(importlib.import_module(module), function))
    root.command()(importlib.import_module("trainyard.cli.dashboard").dashboard)
    for name in SUBAPPS:
        if name in groups:
            group = importlib.import_module(f"trainyard.cli.{name}").app
            root.add_typer(_only_command(group, command), name=name)
    return root


def _log_level_callback() -> Callable[..., None]:
    """The root callback with its ``--log-level`` option (typer made here: this module
    imports no typer at import time)."""
    import typer

    def callback(
        log_level: LogLevel = typer.Option(
            LogLevel.WARNING,
            "--log-level",
            case_sensitive=False,
            help="Log lines at this level and above go to stderr.",
        ),
    ) -> None:
        _global_options(log_level.value)

    callback.__doc__ = "Run NVIDIA OSMO workflow specs on this machine, Slurm or Kubernetes."
    return callback


def _command_name(info: typer.models.CommandInfo) -> str:
    import typer

    if info.name or info.callback is None:
        return info.name or ""
    return typer.main.get_command_name(info.callback.__name__)  # typer's rule


def _only_command(group: typer.Typer, command: str | None) -> typer.Typer:
    """``group`` with only its command named ``command``; ``group`` itself when it has none
    of that name (or ``command`` is None)."""
    if command is None:
        return group
    chosen = [
        info
        for info in group.registered_commands
        if info.callback is not None and _command_name(info) == command
    ]
    if not chosen:
        return group
    narrowed = copy.copy(group)  # the group's own lists stay as they are
    narrowed.registered_commands = chosen
    return narrowed


GLOBAL_OPTIONS = frozenset({"--log-level"})
"""Options of the root command that take a value (given before the command's words)."""


def command_words(argv: Sequence[str]) -> list[str]:
    """``argv`` without the leading global options (``--log-level DEBUG``, ``--log-level=X``),
    so that the first word is the group's name."""
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in GLOBAL_OPTIONS:
            index += 2
        elif word.split("=", 1)[0] in GLOBAL_OPTIONS:
            index += 1
        else:
            break
    return list(argv[index:])


def groups_for(argv: Sequence[str]) -> tuple[str, ...]:
    """The command groups a command line needs: the group it names first (its first word
    after the global options), else every group (``--help``, completion, ``version``, an
    unknown or no command, so that click lists them all)."""
    words = command_words(argv)
    if words and words[0] in SUBAPPS:
        return (words[0],)
    return SUBAPPS


def command_for(argv: Sequence[str]) -> str | None:
    """The command a command line names in its group (its second word, after a group's
    name), else None (every command of the group is built)."""
    words = command_words(argv)
    if len(words) > 1 and words[0] in SUBAPPS and not words[1].startswith("-"):
        return words[1]
    return None


def program_name(argv0: str | None = None) -> str:
    """The name the CLI was called by (``osmo`` or ``trainyard``), for usage and help: the
    base name of ``argv0`` (default ``sys.argv[0]``); ``trainyard`` for any other (``python
    -m``, a test runner)."""
    import os

    name = os.path.basename(argv0 if argv0 is not None else (sys.argv[0] if sys.argv else ""))
    return name if name in ("osmo", "trainyard") else "trainyard"


def __getattr__(name: str) -> typer.Typer:
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = build_app()
    globals()["app"] = built
    return built


def expand_multi_value_flags(argv: Sequence[str]) -> list[str]:
    """Repeat a multi-value flag before each of its values: ``--set a=1 b=2`` becomes
    ``--set a=1 --set b=2`` (a value of ``MULTI_VALUE_FLAGS`` is a word with ``=`` that is
    not an option), and in the commands of ``NARGS_FLAGS`` ``-s RUNNING FAILED`` becomes
    ``-s RUNNING -s FAILED`` (a value: any word that is not an option). Nothing after
    ``--`` is touched."""
    words = command_words(argv)
    nargs = NARGS_FLAGS.get((words[0], words[1]), frozenset()) if len(words) > 1 else frozenset()
    out: list[str] = []
    flag: str | None = None
    for index, word in enumerate(argv):
        if word == "--":  # the rest is a command's own (``workflow exec ID TASK -- CMD``)
            return out + list(argv[index:])
        value = flag is not None and not word.startswith("-") and (flag in nargs or "=" in word)
        if word in MULTI_VALUE_FLAGS or word in nargs:
            flag = word
        elif value and out[-1] != flag:
            out.append(flag)  # type: ignore[arg-type]  # value implies a flag
        elif not value:
            flag = None
        out.append(word)
    return out


def print_error(exc: TrainyardError) -> None:
    """Write an error to stderr: one line per spec problem (then one per warning), else
    ``error: message``. Called as ``osmo``, a command an error suggests (```trainyard app
    list```) is named ```osmo app list```: the same program."""
    import typer

    if isinstance(exc, SpecError):
        for problem in exc.problems:
            typer.echo(_as_called(str(problem)), err=True)
        for warning in exc.warnings:
            typer.echo(_as_called(warning.warning_text()), err=True)
    else:
        typer.echo(_as_called(f"error: {exc}"), err=True)


def _as_called(text: str) -> str:
    from trainyard.cli.progname import invoked_as_osmo

    if not invoked_as_osmo():
        return text
    return text.replace("`trainyard ", "`osmo ").replace("'trainyard ", "'osmo ")


def main(argv: Sequence[str] | None = None, prog_name: str | None = None) -> int:
    """Run the command line; the process exit status.

    Args:
        argv: the arguments after the program name (default ``sys.argv[1:]``).
        prog_name: the program's name in usage lines and errors (default: ``osmo`` when
            called as ``osmo``, else ``trainyard``: ``program_name``).

    Returns:
        0 on success, a ``TrainyardError``'s ``exit_code``, or click's status (2 for a
        usage error). With ``argv`` None (the console script) it does not return: the
        process ends with that status (``exit_now``).
    """
    status = _run(
        sys.argv[1:] if argv is None else argv,
        freeze=argv is None,
        prog_name=prog_name or program_name(),
    )
    if argv is None:  # the console script: nothing runs after the command
        exit_now(status)
    return status


def _run(argv: Sequence[str], *, freeze: bool = False, prog_name: str = "trainyard") -> int:
    from trainyard.cli.progname import set_program

    set_program(prog_name)
    args = expand_multi_value_flags(argv)
    with collector_paused(freeze=freeze):  # typer and the group's imports (httpx...)
        import typer

        from trainyard.cli.lean_typer import use_plain_conversion

        command = typer.main.get_command(build_app(groups_for(args), command_for(args)))
        use_plain_conversion(command)  # str, bool, list[str] and choices: without pydantic
    try:
        command.main(args=args, prog_name=prog_name, standalone_mode=True)
    except TrainyardError as exc:
        print_error(exc)
        return exc.exit_code
    except SystemExit as exc:  # click ends every standalone run this way, usage errors too
        return _exit_status(exc.code)
    return 0


def exit_now(status: int) -> NoReturn:
    """End the process with ``status`` once the command is done: stdout, stderr and logging
    flushed, then ``os._exit`` without the interpreter's teardown of every loaded module
    (slow on a loaded machine, after ``--wait`` already saw the end).
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
