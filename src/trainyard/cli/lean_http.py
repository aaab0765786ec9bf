"""httpx for the command line, without what the CLI never uses (issue 15).

``import httpx`` imports httpx's own command line (``httpx._main``: click, pygments,
``rich.syntax``) whenever click is installed, and the first request imports httpcore, which
imports ``trio`` whenever it is installed (here: pulled in by selenium, a dev dependency) for
async clients under trio. The CLI is synchronous and is not httpx's command line: on a loaded
2-core machine these cost ``workflow submit`` about 0.1 s of its start (``import httpx,
httpcore``: 0.19 s, 0.08 s without them). ``preload_httpx`` imports both libraries with those
two modules made unimportable for the moment of the import, then importable again; the
``import httpx`` after it costs nothing.
"""

from __future__ import annotations

import sys

__all__ = ["preload_httpx", "SKIPPED"]

SKIPPED: tuple[str, ...] = ("httpx._main", "trio")
"""Modules that httpx and httpcore import only if installed, and that the CLI never uses."""


def preload_httpx() -> None:
    """Import httpx and httpcore without ``SKIPPED``. Call it before ``import httpx``.

    A process that already imported httpx or httpcore (a test process, a program that uses
    them) is left as it is, and so is a module of ``SKIPPED`` already imported: nothing is
    taken from a process that has it. Afterwards the skipped names import normally; only httpcore keeps
    no trio support (its async client under trio: never used by the CLI), and ``httpx.main``
    is httpx's stub that asks to install ``httpx[cli]``.
    """
    if "httpx" in sys.modules or "httpcore" in sys.modules:
        return
    blocked = [name for name in SKIPPED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # "import name" raises ImportError
    try:
        import httpcore  # noqa: F401  # imported now, under the block, not at the first request
        import httpx  # noqa: F401
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
