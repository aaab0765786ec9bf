"""``LocalBackend``: every task is a task runner on this machine, its command sandboxed.

Start: the launcher (``local.launcher``) forks a runner per task, or hosts it as a thread
(``local.starting``); an index record per attempt (``backends.attempts``) is written before
the start, so a new backend object finds the attempt again (``recover``). Facts: ``poll``
tails each ``events.jsonl``; a runner gone without EXITED is LOST (``local.tracking``).
Requests: ``local.request``. Design and measurements: docs/local-backend.md.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainyard.backends.attempts import AttemptIndex
from trainyard.backends.base import Backend, TaskFact, TaskKey, TaskLaunch
from trainyard.backends.images import registry_host
from trainyard.backends.local import container
from trainyard.backends.local.isolation import LaunchRequest
from trainyard.backends.local.launcher import LauncherClient
from trainyard.backends.local.probe import Isolation, probe_isolation
from trainyard.backends.local.request import GroupRequest, loopback_address
from trainyard.backends.local.starting import Sender, Start, StartPreparer, group_error
from trainyard.backends.local.tracking import GPUS, Attempt, GpuLeases, gpu_count, has_exit
from trainyard.backends.local.wakeup import FactsSocket
from trainyard.errors import BackendError, ConfigError, RefusedError
from trainyard.pools import Pool, trainyard_home
from trainyard.runner.report import FACTS_SOCKET_ENV
from trainyard.spec.poolfit import allowed_mounts

DEFAULT_PIDS_MAX = 4096
"""Processes and threads one task may hold at once (pool option ``pids_max``): every task
runs as the host's nobody, so without a group of its own one task could take that uid's whole
process count from all others."""

__all__ = [
    "LocalBackend",
    "Isolation",
    "LaunchRequest",
    "GroupRequest",
    "GpuLeases",
    "probe_isolation",
    "loopback_address",
    "gpu_count",
    "create",
]

log = logging.getLogger("trainyard.backends.local")

SANDBOXES = ("auto", "bwrap", "none")
NETWORKS = ("auto", "netns", "loopback")


class LocalBackend(StartPreparer, Backend[GroupRequest]):
    """Runs tasks as sandboxed processes on this machine (see module docstring).

    Args:
        pool: the pool (its ``images`` and ``options``); default: the ``local`` pool's settings.
        home: ``$TRAINYARD_HOME`` (default ``trainyard_home()``).
        state_dir: the backend's own folder (default ``<home>/local``).
        sandbox, network, forward_ports, stop_grace_s: override the pool's options.
        python: the interpreter that runs the runner (default: this one).
    """

    name = "local"

    def __init__(
        self,
        pool: Pool | None = None,
        home: Path | None = None,
        *,
        state_dir: Path | None = None,
        sandbox: str | None = None,
        network: str | None = None,
        forward_ports: list[int] | None = None,
        stop_grace_s: float | None = None,
        python: str | None = None,
    ) -> None:
        options: dict[str, Any] = dict(pool.options) if pool else {}
        self.sandbox = _choice("sandbox", sandbox or options.get("sandbox", "auto"), SANDBOXES)
        self.network = _choice("network", network or options.get("network", "auto"), NETWORKS)
        self.forward_ports = [int(p) for p in (forward_ports or options.get("forward_ports", []))]
        grace = stop_grace_s if stop_grace_s is not None else options.get("stop_grace_s", 10.0)
        self.stop_grace_s = float(grace)
        self.images: dict[str, str] = dict(pool.images) if pool else {}
        self.allowed_mounts: list[str] | None = allowed_mounts(pool) if pool else None
        self.egress = pool.egress if pool else True
        self.allow_host_network = pool.allow_host_network if pool else False
        self.home = Path(home) if home else trainyard_home()
        self.state_dir = Path(state_dir) if state_dir else self.home / "local"
        self.python = python or sys.executable
        self.index = AttemptIndex(self.state_dir)
        self._attempts: dict[TaskKey, Attempt] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopper: threading.Thread | None = None
        self.limits = bool(options.get("limits", True))
        self.pids_max = int(options.get("pids_max", DEFAULT_PIDS_MAX))
        self.insecure_registries: tuple[str, ...] = tuple(
            registry_host(str(r)) for r in options.get("insecure_registries", [])
        )
        """Registries pulled from without TLS verification (podman's ``--tls-verify=false``):
        the pool option ``insecure_registries`` (``host:port`` each), as registries.conf's
        ``insecure = true``."""
        idle = float(options.get("launcher_idle_s", 60.0))
        self._launcher = LauncherClient(self.state_dir, self.python, idle_s=idle)
        self._facts_socket: FactsSocket | None = None
        self._facts_name = hashlib.sha256((pool.name if pool else "").encode()).hexdigest()[:12]

    def build_request(self, launches: list[TaskLaunch]) -> GroupRequest:
        """The gang's start: its launches and this machine's isolation (probed once).

        Raises:
            BackendError: an isolation asked for explicitly does not work here.
        """
        iso = probe_isolation(self.sandbox, self.network, self.python)
        return GroupRequest(list(launches), iso, functools.partial(self._preview, iso=iso))

    def send(self, request: GroupRequest) -> None:
        """Start every task of one gang (all or none).

        Raises:
            BackendError: a task could not start; those already started are stopped.
        """
        error = self._send_all([request])[0]
        if error is not None:
            raise error

    def start_groups(self, groups: list[list[TaskLaunch]]) -> list[BackendError | None]:
        """Start several gangs, each all or none as ``start_group`` does, without waiting for
        the launcher between them (the engine hands one gang at a time: docs/engine.md
        "Starts one gang at a time"). This thread prepares each gang's starts (folders,
        ``run.json``, the index entry) while a sender
        thread (``Sender``) hands the ones prepared so far to the launcher in one
        ``run_many`` request; the launcher records each start it made in the attempt's
        ``launch.json`` before it replies, so an engine killed while waiting for the reply
        finds every started attempt again (``recover``). One gang's failure, or one task's,
        leaves the other gangs alone.

        Returns:
            Per gang, in order: None when every task started, else the ``BackendError``
            saying why not (its tasks that had started are stopped).
        """
        return self._send_all([self.build_request(launches) for launches in groups])

    def _send_all(self, requests: list[GroupRequest]) -> list[BackendError | None]:
        """``start_groups`` of built requests (see there)."""
        self.home.mkdir(parents=True, exist_ok=True)
        results: list[BackendError | None] = [None] * len(requests)
        sent: list[tuple[int, list[Start]]] = []
        with Sender(self._launcher, self._runner_env(), threaded=len(requests) > 1) as sender:
            for index, request in enumerate(requests):
                launches = request.launches
                if not launches:
                    continue
                try:
                    starts = self._prepare_group(launches, request.iso)
                except (OSError, BackendError, ValueError) as exc:
                    results[index] = group_error(launches, exc)
                    continue
                sender.send(starts)
                sent.append((index, starts))
        for index, starts in sent:
            results[index] = self._finish_group(requests[index].launches, starts)
        return results

    def _finish_group(self, launches: list[TaskLaunch], starts: list[Start]) -> BackendError | None:
        """After the launcher's replies: each started attempt is tracked, the GPUs of the
        others given back; a gang with a task that did not start has its started tasks
        stopped (all or none) and gets the first such task's reason."""
        failed: BackendError | None = None
        started: list[TaskKey] = []
        for start in starts:
            if isinstance(start.result, tuple):
                start.attempt.pid, start.attempt.created, recorded = start.result
                with self._lock:
                    self._attempts[start.launch.key] = start.attempt
                started.append(start.launch.key)
                if not recorded:
                    failed = failed or self._record(start)
            else:
                GPUS.give_back(start.attempt)
                failed = failed or start.result or BackendError("the start was never sent")
        if failed is None:
            return None
        self.stop(started)
        return group_error(launches, failed)

    def poll(self) -> list[TaskFact]:
        """Facts since the last call: runner events, each once, and LOST/START_ERROR for a
        runner gone without reporting its exit."""
        with self._lock:
            attempts = [a for a in self._attempts.values() if not a.done]
        facts: list[TaskFact] = []
        ended: list[Attempt] = []
        for attempt in attempts:
            facts += self._poll_one(attempt)
            if attempt.done:
                GPUS.give_back(attempt)
                ended.append(attempt)
        if ended:
            self._kill_leftovers(ended)
            container.remove_containers(a.container for a in ended if a.container)
        return facts

    def stop(self, keys: list[TaskKey]) -> None:
        """SIGTERM the runners now, SIGKILL their whole trees after ``stop_grace_s`` (in the
        background). Idempotent; returns at once; unknown keys are looked up in the index."""
        with self._lock:
            for key in keys:
                attempt = self._attempts.get(key) or self._load(key)
                if attempt is None or attempt.stopping:
                    continue
                attempt.stopping = True
                attempt.stop_deadline = time.monotonic() + self.stop_grace_s
                self._attempts[key] = attempt
            self._ensure_stopper()
        self._wake.set()

    def kill(self, keys: list[TaskKey]) -> None:
        """``stop`` with no grace: the runners' whole trees SIGKILLed at once, no SIGTERM
        (a hosted runner's command SIGKILLed by its runner, which then reports). Also for
        attempts already stopping (a force after a plain cancel). Idempotent; returns at
        once."""
        with self._lock:
            for key in keys:
                attempt = self._attempts.get(key) or self._load(key)
                if attempt is None or attempt.forced:
                    continue
                attempt.stopping = attempt.forced = True
                if not attempt.hosted:
                    attempt.termed = True  # no SIGTERM: the SIGKILL comes at once
                attempt.stop_deadline = time.monotonic()
                self._attempts[key] = attempt
            self._ensure_stopper()
        self._wake.set()

    def close(self) -> None:
        """Tell the launcher (if one runs) to exit once its runners have ended; stop
        listening for runners' events (``notify_facts``)."""
        if self._facts_socket is not None:
            self._facts_socket.close()
            self._facts_socket = None
        self._launcher.release()

    def notify_facts(self, wake: Callable[[], None]) -> bool:
        """``Backend.notify_facts``: call ``wake`` (from a thread of its own) whenever a
        runner started from now on writes an event, so the engine polls at once instead of at its next tick
        (``backends.local.wakeup``: a Unix datagram socket in the state folder, named to the
        runners by ``FACTS_SOCKET_ENV``). Returns whether it listens; False when the socket
        cannot be bound (e.g. a state folder whose path is too long): facts are then read at
        the engine's tick, as without this hook. Calling it again replaces ``wake``."""
        if self._facts_socket is not None:
            self._facts_socket.close()
            self._facts_socket = None
        path = self.state_dir / f"facts-{self._facts_name}.sock"
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self._facts_socket = FactsSocket(path, wake)
        except OSError as exc:
            log.info(
                "runners' events are read at the engine's tick: no socket at %s (%s)", path, exc
            )
            return False
        return True

    def _runner_env(self) -> dict[str, str]:
        """The environment a runner starts with: the server's, and the facts socket."""
        env = dict(os.environ)
        if self._facts_socket is not None:
            env[FACTS_SOCKET_ENV] = self._facts_socket.path
        return env

    def host_of(self, key: TaskKey, node: str) -> str:
        """``{{host:TASK}}``: a stable 127/8 address of the task (``loopback_address``)."""
        return loopback_address(key.workflow_id, key.task)

    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Adopt these attempts after an engine restart; returns those still running (a
        runner that already reported EXITED counts as finished even while it exits).

        Every adopted attempt's events are reported again from the start by ``poll`` (the
        engine must treat repeated facts as no-ops); one that is gone without an EXITED event
        is reported LOST, as is one this machine has no record of.
        """
        alive = []
        with self._lock:
            for key in keys:
                attempt = self._attempts.get(key) or self._load(key) or Attempt(key, None)
                self._attempts[key] = attempt
                if self._alive(attempt) and not has_exit(attempt):
                    GPUS.hold(attempt, attempt.gpus)
                    alive.append(key)
        return alive

    def entry(self, key: TaskKey) -> dict[str, Any]:
        """How to enter the running attempt ``key`` (``workflow exec``, ``port-forward``,
        ``rsync``; ``Backend.entry``): ``{"backend": "local", "machine": this machine's boot id,
        "pid", "created": its bwrap init process (``backends.local.enter.find_sandbox_init``),
        "address": the task's address in its group namespace, "run_dir"}``.

        Raises:
            RefusedError: the attempt is unknown here, has ended, or runs no bwrap sandbox.
        """
        from trainyard.backends.local.enter import find_sandbox_init, machine_id

        with self._lock:
            attempt = self._attempts.get(key) or self._load(key)
        if attempt is None or attempt.run_dir is None or attempt.pid is None:
            raise RefusedError(
                f"task {key.task} (retry {key.retry_id}) has no running process on this machine"
            )
        init = find_sandbox_init(attempt.pid, attempt.created, attempt.run_dir)
        return {
            "backend": "local",
            "machine": machine_id(),
            "pid": init.pid,
            "created": init.create_time(),
            "address": self.host_of(key, ""),
            "run_dir": str(attempt.run_dir),
        }

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Those of ``keys`` this machine surely never started: no index entry (it is written
        before the runner is started), so starting them now cannot run one twice."""
        with self._lock:
            return [k for k in keys if k not in self._attempts and not self.index.has(k)]

    def forget(self, workflow_id: str) -> None:
        """Drop what this backend keeps of an ended workflow that is being deleted (its
        attempts' index entries, ``Backend.forget``). Its attempts must no
        longer run (the engine checks with ``recover`` first)."""
        with self._lock:
            for key in [k for k in self._attempts if k.workflow_id == workflow_id]:
                del self._attempts[key]
            self.index.forget(workflow_id)


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, else ConfigError naming the option."""
    if value not in choices:
        raise ConfigError(
            f"local backend option {name}: expected one of {', '.join(choices)}, got {value!r}"
        )
    return value


def create(pool: Pool, home: Path) -> LocalBackend:
    """Registry entry: the local backend for ``pool`` with state under ``home``."""
    return LocalBackend(pool, home)
