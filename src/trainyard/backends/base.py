"""The abstract base every backend fills, and the facts backends report.

A backend starts the task runners of a placed group, reports *facts* about them (started,
running, exited with a code, lost), and stops them. It never decides a status: the engine's
state machine does. Every backend runs the same task runner (``python -m trainyard.runner
RUN_JSON``); the runner writes ``<run_dir>/events.jsonl`` and ``<run_dir>/task.log``.

Starting is ``start_group = send(build_request(launches))`` (torchx's ``submit``); the
request's ``render()`` is the dry run. Every hook the engine calls is declared on ``Backend``
with its default; a backend overrides what it supports. See docs/architecture.md.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from trainyard.errors import ConfigError, RefusedError
from trainyard.tasktokens import task_token

__all__ = [
    "FactKind",
    "TaskKey",
    "TaskFact",
    "TaskResources",
    "TaskLaunch",
    "Request",
    "Backend",
    "server_url_for_tasks",
    "task_api_env",
]


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
        registry_credentials: the submitter's REGISTRY credentials for the registry of
            the task's image (``images.registry_credentials_for``), decrypted: for the
            backend's pull of that image only, never written into ``run`` (so never into a
            run file, a log or a dry run's output).
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
    registry_credentials: list[dict[str, str]] = field(default_factory=list, repr=False)


class Request(Protocol):
    """What ``build_request`` returns: a typed start of one gang, built apart from sending."""

    def render(self) -> str:
        """The request as a person reads it (``--dry-run``); empty: nothing to show."""


RequestT = TypeVar("RequestT", bound=Request)


class Backend(ABC, Generic[RequestT]):
    """What the engine needs from a backend. Methods must not block for long.

    Subclasses fill ``build_request``, ``send``, ``poll``, ``stop``, ``host_of`` and
    ``recover``; the other hooks have a default that suits a backend without the feature.
    """

    name: str = ""
    """The backend's registry name (``local``, ``slurm``, ...)."""

    # ------------------------------------------------------------------ starting

    def start_group(self, launches: list[TaskLaunch]) -> None:
        """Start every task of one gang, all or none: ``send(build_request(launches))``.
        Nothing to do for no launches.

        Raises:
            BackendError: the group cannot start (its started tasks are stopped).
        """
        if launches:
            self.send(self.build_request(launches))

    def dry_run(self, launches: list[TaskLaunch]) -> str:
        """What ``start_group(launches)`` would send, for ``--dry-run``; starts and writes
        nothing. Empty when the backend has nothing to show."""
        return self.build_request(launches).render() if launches else ""

    @abstractmethod
    def build_request(self, launches: list[TaskLaunch]) -> RequestT:
        """The request that starts this gang (pure: no process, no file written).

        Raises:
            BackendError: the gang cannot be started here (e.g. an isolation asked for
                explicitly does not work).
        """

    @abstractmethod
    def send(self, request: RequestT) -> None:
        """Carry out ``request``: the tasks start, all or none.

        Raises:
            BackendError: it failed; what had started of it is stopped.
        """

    # ------------------------------------------------------------------ observing, stopping

    @abstractmethod
    def poll(self) -> list[TaskFact]:
        """Facts observed since the last call (each fact reported once)."""

    @abstractmethod
    def stop(self, keys: list[TaskKey]) -> None:
        """Stop these attempts with their whole process trees. Idempotent, non-blocking."""

    def kill(self, keys: list[TaskKey]) -> None:
        """Stop these attempts with no grace period (OSMO's ``workflow cancel --force``:
        "Force cancel task group pods in the cluster"): their processes get SIGKILL, no
        SIGTERM first. Idempotent, non-blocking. This default stops them as ``stop`` does,
        for a backend that cannot do better (Slurm: scancel, SIGKILL after KillWait)."""
        self.stop(keys)

    @abstractmethod
    def host_of(self, key: TaskKey, node: str) -> str:
        """The address other tasks of the group use to reach ``key`` (``{{host:TASK}}``)."""

    @abstractmethod
    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        """After an engine restart: which of these attempts are still alive (the others
        are reported LOST by ``poll`` unless they reported their exit)."""

    def close(self) -> None:
        """The engine is done with this backend object: release helpers it holds for this
        process. Running tasks keep running (a new engine recovers them). Default: nothing."""

    # ------------------------------------------------------------------ optional features

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """After an engine restart: those of ``keys`` this backend surely never started (no
        trace of a start), so starting them now cannot run one twice; the engine starts them
        instead of adopting them with ``recover``. Default: none (every attempt counts as
        started; one never started is then reported LOST)."""
        return []

    def waiting_reason(self, key: TaskKey) -> str:
        """Why the attempt ``key``, started but not running yet, waits in this backend's own
        queue (Slurm's pending reason, Kubernetes' Unschedulable message), in one line; ""
        when it does not wait or the backend cannot tell. Read every few seconds for each
        task of a placed gang none of whose tasks started, so it must not block; the engine
        keeps ``task NAME: REASON`` of the first task that has one as the group's waiting
        reason. Default: "" (the backend has no scheduler of its own)."""
        return ""

    def notify_facts(self, wake: Callable[[], None]) -> bool:
        """Call ``wake()`` (from any thread, without blocking) whenever new facts may be
        there to ``poll``, so the engine reads a start or an exit as it happens. Returns
        whether it will. Default: False (facts are read at the engine's tick)."""
        return False

    def entry(self, key: TaskKey) -> dict[str, Any]:
        """How to enter the running attempt ``key`` (``workflow exec``, ``port-forward``,
        ``rsync``): a JSON-able dict whose ``backend`` names this backend.

        Raises:
            RefusedError: always by default (the backend cannot enter a running task); a
                backend that can raises it when the attempt is not running.
        """
        raise RefusedError(
            f"the {self.name} backend cannot enter a running task (exec, port-forward and rsync)"
        )

    def forget(self, workflow_id: str) -> None:
        """Drop what this backend keeps of a workflow being deleted; its attempts no
        longer run (the engine checks with ``recover`` first). Default: nothing kept."""


def server_url_for_tasks(home: Path) -> str | None:
    """The URL of the trainyard server that tasks should talk to (``osmo``/``trainyard``
    inside a task): ``$TRAINYARD_SERVER_URL``, else the one the server of ``home`` wrote in
    ``<home>/server.json`` (or in its lock's note, ``server.lock``, should that file be
    gone); None when neither is there. Every backend hands it to its tasks as
    ``TRAINYARD_SERVER_URL``."""
    url = os.environ.get("TRAINYARD_SERVER_URL")
    if url:
        return url
    for name in ("server.json", "server.lock"):  # the lock's note holds it too
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


OptionsT = TypeVar("OptionsT", bound=BaseModel)


def parse_pool_options(
    model: type[OptionsT], pool_name: str, backend: str, options: dict[str, Any]
) -> OptionsT:
    """Validate a pool's ``options`` against a backend's options ``model``.

    Raises:
        ConfigError: an unknown option or a bad value; the message names the pool and
            lists the valid options.
    """
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors()
        )
        valid = ", ".join(model.model_fields)
        raise ConfigError(f"pool {pool_name!r} ({backend}): {problems} (options: {valid})") from exc
