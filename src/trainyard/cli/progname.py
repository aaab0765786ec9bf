"""Which program the user called: ``osmo`` (OSMO's command lines, OSMO's defaults) or
``trainyard``. ``cli.main`` sets it, from argv[0], before it runs a command."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["invoked_as_osmo", "by_program", "program", "set_program"]

T = TypeVar("T")

_program = "trainyard"


def set_program(name: str) -> None:
    """Record the name the CLI was called by (``osmo`` or ``trainyard``)."""
    global _program
    _program = name


def program() -> str:
    """The name the CLI was called by; ``trainyard`` unless ``set_program`` said otherwise."""
    return _program


def invoked_as_osmo() -> bool:
    """Whether the command line was given to ``osmo``."""
    return _program == "osmo"


def by_program(osmo: T, trainyard: T) -> T:
    """``osmo``'s default when called as ``osmo`` (OSMO's CLI reference), else
    ``trainyard``'s."""
    return osmo if invoked_as_osmo() else trainyard
