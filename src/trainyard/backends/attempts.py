"""Attempt bookkeeping that every backend keeping state on disk shares.

Each attempt a backend starts gets an index record, written before anything is started,
``<state_dir>/attempts/<workflow>/<task>/<retry>.json`` (names percent-quoted), so that a
new backend object (after an engine restart) finds the attempt again and knows that an
attempt without one was never started. Files are written whole (a temporary file renamed
over the target) and private (0600: a run file holds a task token).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from trainyard.backends.base import TaskKey

__all__ = ["AttemptIndex", "write_private", "write_json", "tail"]


class AttemptIndex:
    """The index records of one backend's attempts under ``<state_dir>/attempts``."""

    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir) / "attempts"

    def path(self, key: TaskKey) -> Path:
        """Where ``key``'s record lives."""
        return self.root / _safe(key.workflow_id) / _safe(key.task) / f"{key.retry_id}.json"

    def write(self, key: TaskKey, record: dict[str, Any]) -> None:
        """Write ``key``'s record whole. Raises OSError."""
        write_json(self.path(key), record)

    def read(self, key: TaskKey) -> dict[str, Any] | None:
        """``key``'s record; None when there is none or it cannot be read as a JSON object."""
        try:
            record = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def has(self, key: TaskKey) -> bool:
        """Whether ``key`` has a record (it was, or was about to be, started)."""
        return self.path(key).exists()

    def forget(self, workflow_id: str) -> None:
        """Remove every record of ``workflow_id``. Idempotent."""
        shutil.rmtree(self.root / _safe(workflow_id), ignore_errors=True)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole and readable by its owner only (0600), making the
    parent folders. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    partial.replace(path)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``write_private`` of ``data`` as JSON."""
    write_private(path, json.dumps(data))


def tail(path: Path, limit: int = 400) -> str:
    """The last ``limit`` characters of a text file, stripped; empty when it is unreadable."""
    try:
        return path.read_text(errors="replace")[-limit:].strip()
    except OSError:
        return ""


def _safe(name: str) -> str:
    return quote(name, safe="") or "_"
