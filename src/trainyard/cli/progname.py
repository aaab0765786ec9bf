"""Which program the user called: ``osmo`` (OSMO's command lines, OSMO's defaults) or
``trainyard``. Read from click's root context, which ``cli.main`` names after argv[0]."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["invoked_as_osmo", "by_program", "program"]

T = TypeVar("T")


def program() -> str:
    """The root command's name (``osmo`` or ``trainyard``); ``trainyard`` outside a
    command."""
    import click

    ctx = click.get_current_context(silent=True)
    return (ctx.find_root().info_name or "trainyard") if ctx is not None else "trainyard"


def invoked_as_osmo() -> bool:
    """Whether the command line was given to ``osmo``."""
    return program() == "osmo"


def by_program(osmo: T, trainyard: T) -> T:
    """``osmo``'s default when called as ``osmo`` (OSMO's CLI reference), else
    ``trainyard``'s."""
    return osmo if invoked_as_osmo() else trainyard
