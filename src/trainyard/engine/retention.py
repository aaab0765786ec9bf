"""Retention: removing the run folders (and, when asked, the store rows) of ended workflows.

A workflow's run folder is ``$TRAINYARD_HOME/runs/<workflow id>`` (its tasks' logs, events,
sandboxes, ``{{output}}``); what it uploaded (datasets, output URLs) is never touched here.
``workflow delete`` and ``workflow prune`` remove rows and folders (``Engine.delete``). The
server removes the run folders (not the rows) of workflows that ended more than
``$TRAINYARD_RUN_RETENTION`` ago (default 7 days, the window of
``recovery.LEFTOVER_WINDOW_S``), every ``sweep_interval_s``; ``off`` turns that off. A folder
is only removed once no attempt of its workflow still runs (the backend is asked, as a
restarted engine does) and no file system is mounted below it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Protocol

from trainyard.errors import ConfigError, TrainyardError
from trainyard.quantity import format_duration_s, parse_duration_s
from trainyard.store import Store

__all__ = [
    "DEFAULT_RUN_RETENTION_S",
    "RETENTION_ENV",
    "run_retention_s",
    "mounts_under",
    "remove_run_folder",
    "sweep",
    "start_sweeper",
]

log = logging.getLogger("trainyard.retention")


class Engine(Protocol):
    """What a sweep needs of the engine (``engine.reconciler.Engine``)."""

    store: Store
    home: Path

    def delete(self, workflow_ids: list[str], *, keep_records: bool = False) -> None:
        """Remove workflows' run folders (and their rows unless ``keep_records``)."""


DEFAULT_RUN_RETENTION_S = 7 * 24 * 3600.0
"""Run folders of workflows that ended longer ago than this are removed (7 days)."""

RETENTION_ENV = "TRAINYARD_RUN_RETENTION"
"""The server's setting: a duration (``30s``, ``12h``, ``7d``, seconds) or ``off``."""

_LOOKUP_CHUNK = 500  # ids per store query (SQLite's limit on bound parameters is higher)


def run_retention_s(value: str | None = None) -> float | None:
    """The run-folder retention in seconds from ``value`` (default ``$TRAINYARD_RUN_RETENTION``,
    unset: 7 days); None for ``off``.

    Raises:
        ConfigError: not a duration; the message says what to write.
    """
    text = os.environ.get(RETENTION_ENV, "") if value is None else value
    text = text.strip()
    if not text:
        return DEFAULT_RUN_RETENTION_S
    if text.lower() in ("off", "never", "none"):
        return None
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise ConfigError(f"{RETENTION_ENV}={text!r}: {exc}, or 'off'") from exc


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this process's mount namespace (Linux
    ``/proc/self/mountinfo``; empty where there is none)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    root = str(path.resolve()) if path.exists() else str(path)
    found = []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            if point == root or point.startswith(root + "/"):
                found.append(point)
    return found


def remove_run_folder(path: Path) -> bool:
    """Remove one run folder (never following a link out of it). Returns whether it existed.

    Raises:
        TrainyardError: a file system is mounted below it (nothing is removed).
    """
    if not path.exists() and not path.is_symlink():
        return False
    mounted = mounts_under(path)
    if mounted:
        raise TrainyardError(
            f"{path} has file systems mounted below it ({', '.join(mounted)}); unmount them first"
        )
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)
    return True


def _end_times(engine: Engine, ids: list[str]) -> dict[str, float | None]:
    ends: dict[str, float | None] = {}
    for start in range(0, len(ids), _LOOKUP_CHUNK):
        found = engine.store.workflow_end_times(ids[start : start + _LOOKUP_CHUNK])
        ends.update({wid: end for wid, (_owner, end) in found.items()})
    return ends


def sweep(engine: Engine, retention_s: float, *, now_s: float | None = None) -> list[str]:
    """Remove the run folders of workflows that ended more than ``retention_s`` ago (their
    rows are kept), and folders of no stored workflow older than that (left by a delete
    that was killed half way). Returns the workflow ids whose folders were removed."""
    now_s = time.time() if now_s is None else now_s
    runs = engine.home / "runs"
    names = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
    ends = _end_times(engine, names)
    removed = []
    for name in names:
        if name in ends:
            end = ends[name]
            if end is None or end >= now_s - retention_s:
                continue
            try:
                engine.delete([name], keep_records=True)
            except TrainyardError as exc:
                log.warning("retention: run folder of %s kept for now: %s", name, exc)
                continue
        else:
            folder = runs / name
            try:
                if folder.stat().st_mtime >= now_s - retention_s:
                    continue
                remove_run_folder(folder)
            except (OSError, TrainyardError) as exc:
                log.warning("retention: %s kept for now: %s", folder, exc)
                continue
        removed.append(name)
    if removed:
        log.info(
            "retention: removed the run folders of %d workflow(s) ended more than %s ago",
            len(removed),
            format_duration_s(retention_s),
        )
    return removed


def start_sweeper(
    engine: Engine, stop: threading.Event, retention_s: float | None, *, first_delay_s: float = 10.0
) -> threading.Thread | None:
    """Run ``sweep`` in a daemon thread until ``stop``: first after ``first_delay_s``, then
    every tenth of the retention (at least every minute, at most every hour). None when
    retention is off."""
    if retention_s is None:
        return None
    interval_s = min(max(retention_s / 10, 60.0), 3600.0)

    def loop() -> None:
        delay = first_delay_s
        while not stop.wait(delay):
            try:
                sweep(engine, retention_s)
            except Exception:  # noqa: BLE001 - a failed sweep is retried at the next one
                log.exception("retention sweep failed")
            delay = interval_s

    thread = threading.Thread(target=loop, name="trainyard-retention", daemon=True)
    thread.start()
    return thread
