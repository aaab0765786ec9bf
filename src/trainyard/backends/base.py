"""The one small interface every backend implements, and the facts backends report.

A backend starts the task runners of a placed group, reports *facts* about them (started,
running, exited with a code, lost), and stops them. It never decides a status: the engine's
state machine does (../shared/DESIGN.md, "Rules of the house").

Every backend runs the same task runner (``python -m trainyard.runner RUN_JSON``) for every
task; the runner writes its events to ``<run_dir>/events.jsonl`` and its log to
``<run_dir>/task.log``, so facts can be read the same way everywhere a filesystem is shared.

Optional hooks (the engine looks them up with ``getattr``; a backend may leave them out):
- ``dry_run(launches) -> object``: what ``start_group`` would send, for ``--dry-run``.
- ``unstarted(keys) -> list[TaskKey]``: after an engine restart, those of ``keys`` that this
  backend surely never started (no trace of a start, so starting them now cannot run one
  twice). The engine starts them instead of adopting them with ``recover``; without the hook
  every attempt counts as started, and one never started is reported LOST.
- ``notify_facts(wake) -> bool``: call ``wake()`` (from any thread, without blocking) when
  new facts may be there to ``poll``, so the engine reads a start or an exit as it happens
  instead of at its next tick (issue 15; the local backend: ``backends.wakeup``). Returns
  whether it will; without the hook facts are read at the engine's tick.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from trainyard.tasktokens import task_token

__all__ = ["FactKind", "TaskKey", "TaskFact", "TaskResources", "TaskLaunch", "Backend",
           "server_url_for_tasks", "task_api_env"]


class FactKind(StrEnum):
    """What a backend can observe about one task attempt."""

    INITIALIZING = "INITIALIZING"  # runner started: downloading inputs, writing files
    RUNNING = "RUNNING"  # barrier passed, user command started
    EXITED = "EXITED"  # runner finished; exit_code is the task's (0-255 user, >=2000 service)
    LOST = "LOST"  # the process vanished without reporting an exit (node lost, killed)
    START_ERROR = "START_ERROR"  # the backend could not start it at all


@dataclass(frozen=True, order=True)
class TaskKey:
    """Identifies one attempt of one task: (workflow id, task name, retry id)."""

    workflow_id: str
    task: str
    retry_id: int


@dataclass(frozen=True)
class TaskFact:
    """One observation about a task attempt; ``time_s`` is a Unix timestamp."""

    key: TaskKey
    kind: FactKind
    time_s: float
    exit_code: int | None = None
    message: str = ""
    failure: str | None = None
    """A kind of failure seen (``IMAGE_PULL``: the image could not be found or pulled)."""


@dataclass(frozen=True)
class TaskResources:
    """What one task asks of its node (the spec's resource entry; 0 asks for nothing).

    Backends that allocate nodes themselves (Slurm, Kubernetes) turn it into their request.
    """

    cpu: float = 0.0
    gpu: int = 0
    memory_bytes: int = 0
    storage_bytes: int = 0


@dataclass
class TaskLaunch:
    """Everything a backend needs to start one task attempt on one node.

    Attributes:
        key: the attempt.
        group: the task's group name.
        node: the pool node the scheduler placed it on.
        run_dir: folder of this attempt (runner events, log, sandbox state).
        run: the runner's input (``trainyard.runfile.TaskRun`` as a dict).
        gpu_slots: indices of the GPU slots assigned on ``node`` (empty for none).
        restart_in_place: re-run the command in the existing sandbox (exit action RESTART).
        resources: what the task asks of its node.
        exec_timeout_s: the workflow's exec timeout (None: none). The engine enforces it;
            a backend may give its own allocation a later limit as a backstop.
    """

    key: TaskKey
    group: str
    node: str
    run_dir: Path
    run: dict[str, Any]
    gpu_slots: list[int] = field(default_factory=list)
    restart_in_place: bool = False
    resources: TaskResources = field(default_factory=TaskResources)
    exec_timeout_s: float | None = None


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a backend. Methods must not block for long."""

    name: str

    def start_group(self, launches: list[TaskLaunch]) -> None:
        """Start every task of one gang. Raises BackendError if the group cannot start."""

    def poll(self) -> list[TaskFact]:
        """Facts observed since the last call (each fact reported once)."""

    def stop(self, keys: list[TaskKey]) -> None:
        """Stop these attempts with their whole process trees. Idempotent, non-blocking."""

    def host_of(self, key: TaskKey, node: str) -> str:
        """The address other tasks of the group use to reach ``key`` (``{{host:TASK}}``)."""

    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        """After an engine restart: which of these attempts are still alive."""

    def close(self) -> None:
        """The engine is done with this backend object: release helpers it holds for this
        process. Running tasks keep running (a new engine recovers them)."""


def server_url_for_tasks(home: Path) -> str | None:
    """The URL of the trainyard server that tasks should talk to (``osmo``/``trainyard``
    inside a task): ``$TRAINYARD_SERVER_URL``, else the one the server of ``home`` wrote in
    ``<home>/server.json`` (or in its lock's note, ``server.lock``, should that file be
    gone); None when neither is there. Every backend hands it to its tasks as
    ``TRAINYARD_SERVER_URL``."""
    url = os.environ.get("TRAINYARD_SERVER_URL")
    if url:
        return url
    for name in ("server.json", "server.lock"):  # the lock's note holds it too (issue 12)
        try:
            return str(json.loads((home / name).read_text())["url"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def task_api_env(home: Path, workflow_id: str) -> dict[str, str]:
    """What a task of ``workflow_id`` needs to use the API (``osmo``/``trainyard`` inside a
    task): ``TRAINYARD_SERVER_URL`` (``server_url_for_tasks``) and ``TRAINYARD_TOKEN``, a task
    token scoped to that workflow and its submitter that expires when the workflow ends
    (``trainyard.tasktokens``); never the admin's or the submitter's own token. Empty when
    no server is known. Every backend puts it in the task's environment.
    """
    url = server_url_for_tasks(home)
    if not url:
        return {}
    return {"TRAINYARD_SERVER_URL": url, "TRAINYARD_TOKEN": task_token(home, workflow_id)}
