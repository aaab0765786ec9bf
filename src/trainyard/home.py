"""Where trainyard keeps its state (``$TRAINYARD_HOME``).

A module of its own, importing nothing but the standard library, so the command line finds
its home without importing ``trainyard.pools`` (pydantic and the pool models, a
noticeable part of ``workflow submit``'s start). ``trainyard.pools``
re-exports ``trainyard_home`` for the code that already imports it from there.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["trainyard_home"]


def trainyard_home() -> Path:
    """Where trainyard keeps its state: ``$TRAINYARD_HOME``, else the XDG data folder
    (``$XDG_DATA_HOME/trainyard``, default ``~/.local/share/trainyard``). Created if absent."""
    env = os.environ.get("TRAINYARD_HOME")
    if env:
        home = Path(env)
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        home = Path(base) / "trainyard"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)  # tokens, store, logs: the owner's only
    return home
