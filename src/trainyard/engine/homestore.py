"""A home serves one store at a time: what the home keeps for a store's workflows (task-token
key, run folders) is bound to that store's identity (``Store.identity``), so that nothing of
an old store's workflows reaches a new store's workflows that get the same ids.

``bind_home`` runs when an engine starts: on another store it rotates the task-token key and
moves the old ``runs`` folder aside whole (``runs.before-<id>``; nothing is deleted).

Design: docs/engine.md, "Module: `src/trainyard/engine/homestore.py`".
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from trainyard import tasktokens
from trainyard.store import Store

__all__ = ["IDENTITY_FILE", "bind_home"]

IDENTITY_FILE = "store-identity"
"""The file in the home that names the store the home serves (its ``Store.identity``)."""

log = logging.getLogger(__name__)


def bind_home(home: Path, store: Store) -> bool:
    """Bind ``home`` to ``store`` (module docstring). Idempotent: on the store the home
    already serves it changes nothing.

    Returns:
        Whether the home was serving another store (its task-token key rotated and its run
        folders moved aside).
    """
    recorded = _recorded(home)
    if recorded == store.identity:
        return False
    foreign = recorded is not None or _has_foreign_runs(home, store)
    if foreign:
        _retire(home, store.identity)
    _record(home, store.identity)
    return foreign


def _recorded(home: Path) -> str | None:
    """The identity recorded in the home, or None when there is none."""
    try:
        return (home / IDENTITY_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _record(home: Path, identity: str) -> None:
    """Record ``identity`` in the home (atomically, owner-only)."""
    home.mkdir(parents=True, exist_ok=True)
    fresh = home / f"{IDENTITY_FILE}.{os.getpid()}.new"
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(identity + "\n")
    os.replace(fresh, home / IDENTITY_FILE)


def _run_folder_ids(home: Path) -> list[str]:
    runs = home / "runs"
    return [p.name for p in runs.iterdir() if p.is_dir()] if runs.is_dir() else []


def _has_foreign_runs(home: Path, store: Store) -> bool:
    """Whether the home holds a run folder of a workflow that ``store`` does not hold."""
    ids = _run_folder_ids(home)
    return bool(ids) and store.known_workflow_ids(ids) != set(ids)


def _free(path: Path) -> Path:
    """``path``, or ``path.N`` with the first N that names nothing yet."""
    found, number = path, 1
    while found.exists():
        found, number = path.with_name(f"{path.name}.{number}"), number + 1
    return found


def _retire(home: Path, identity: str) -> None:
    """Rotate the task-token key and move ``runs`` aside: the home served another store."""
    tasktokens.rotate_key(home)
    runs = home / "runs"
    if runs.is_dir():
        aside = _free(home / f"runs.before-{identity[:12]}")
        os.rename(runs, aside)  # one rename: never half moved
        log.warning(
            "this home served another store: its run folders were moved aside to "
            "%s and task tokens made before are refused",
            aside,
        )
    else:
        log.warning("this home served another store: task tokens made before are refused")
