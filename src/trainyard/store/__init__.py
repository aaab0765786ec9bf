"""store layer: persistence of workflows and apps (SQLAlchemy). See store/db.py.

The names below are loaded from ``store/db.py`` when first used (PEP 562), so that importing
``trainyard.store.lock`` (the CLI does on every start) does not import SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.store.db import AppRecord, Store, WorkflowRecord, default_url

__all__ = ["Store", "WorkflowRecord", "AppRecord", "default_url"]


def __getattr__(name: str) -> Any:  # noqa: ANN401 - the attribute asked for
    if name in __all__:
        from trainyard.store import db

        return getattr(db, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
