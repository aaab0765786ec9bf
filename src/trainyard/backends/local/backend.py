"""``LocalBackend``: every task is a task runner on this machine, its command sandboxed.

Start: the launcher (``local.launcher``) forks a runner per task, or hosts it as a thread;
an index record per attempt (``backends.attempts``) is written before the start and the
runner's pid and create time go to ``<run_dir>/launch.json``, so a new backend object finds
the attempt again (``recover``). Facts: ``poll`` tails each ``events.jsonl``; a runner gone
without EXITED is LOST. Stop: SIGTERM, then SIGKILL of the whole tree after
``stop_grace_s``. Design and measurements: docs/local-backend.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import queue
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import psutil

from trainyard.backends.attempts import AttemptIndex, tail, write_json
from trainyard.backends.base import Backend, FactKind, TaskFact, TaskKey, TaskLaunch
from trainyard.backends.base import server_url_for_tasks, task_api_env
from trainyard.backends.facts import ENDING, read_facts
from trainyard.backends.local import container
from trainyard.backends.images import (image_note, image_summary, registry_host, runtime_for,
                                       runtime_path)
from trainyard.backends.local.netns import (GroupNetwork, ensure_group_network, probe_egress_attach,
                                     probe_netns)
from trainyard.backends.local.router import probe_router
from trainyard.backends.local.isolation import LaunchRequest, strategy_for
from trainyard.backends.local.launcher import LauncherClient
from trainyard.backends.local.wakeup import FactsSocket
from trainyard.backends.local.sandbox import (OSMO_WORKSPACE, bwrap_end, clear_links,
                                              probe_bwrap, probe_remap)
from trainyard.errors import BackendError, ConfigError, RefusedError
from trainyard.pools import Pool, real_gpu_count, trainyard_home
from trainyard.linux import proctree
from trainyard.runner.hosted import DATA_FIELDS, ENDED, hostable
from trainyard.runner.report import EVENTS, FACTS_SOCKET_ENV, read_events
from trainyard.runfile import SandboxSettings, TaskLimits, TaskRun
from trainyard.spec.fields import split_mount
from trainyard.spec.poolfit import ALLOWED_MOUNTS_OPTION, allowed_mounts

DEFAULT_PIDS_MAX = 4096
"""Processes and threads one task may hold at once (pool option ``pids_max``): every task
runs as the host's nobody, so without a group of its own one task could take that uid's whole
process count from all others."""

__all__ = ["LocalBackend", "Isolation", "LaunchRequest", "GroupRequest", "GpuLeases",
           "probe_isolation",
           "loopback_address", "gpu_count", "create"]

log = logging.getLogger("trainyard.backends.local")

SANDBOXES = ("auto", "bwrap", "none")
NETWORKS = ("auto", "netns", "loopback")
RUNNER_OUT = "runner.out"
LAUNCH = "launch.json"
ADOPTED = ("sandbox", "output")
"""Folders of a run_dir that a RESTART in place takes over from the attempt before."""
ALIVE_CHECK_S = 0.5
"""How often ``poll`` asks whether a runner still lives (a LOST fact comes that much later)."""


# ---------------------------------------------------------------------- isolation probe


@dataclass(frozen=True)
class Isolation:
    """How tasks are isolated on this machine: bubblewrap or not, group namespaces or not."""

    bwrap: bool
    netns: bool


_probed: dict[tuple[str, str, str], Isolation] = {}
_warned: set[str] = set()
_probe_lock = threading.Lock()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _want(choice: str, name: str, why_not: str | None) -> bool:
    if why_not is None:
        return choice != "none" and choice != "loopback"
    if choice in ("bwrap", "netns"):
        raise BackendError(f"local backend: {name} {choice!r} was asked for but fails here: {why_not}")
    return False


def probe_isolation(sandbox: str = "auto", network: str = "auto",
                    python: str = sys.executable) -> Isolation:
    """What isolation works here (probed once per process and settings; warns once).

    Raises:
        BackendError: ``bwrap`` or ``netns`` was asked for explicitly and does not work.
    """
    with _probe_lock:
        cached = _probed.get((sandbox, network, python))
        if cached is None:
            cached = _probed[(sandbox, network, python)] = _probe(sandbox, network, python)
        return cached


def _probe(sandbox: str, network: str, python: str) -> Isolation:
    why_net = probe_netns(python) if network != "loopback" else "not asked for"
    use_net = _want(network, "network", why_net)
    why_bwrap = probe_bwrap() if sandbox != "none" else "not asked for"
    use_bwrap = _want(sandbox, "sandbox", why_bwrap)
    if use_net and use_bwrap and _combined_fails(python):
        use_bwrap = _want(sandbox, "sandbox", "bubblewrap fails inside a network namespace")
    if not use_bwrap and sandbox == "auto":
        _warn_once(f"local backend: no bubblewrap sandbox ({why_bwrap or 'fails'}); tasks share "
                   "the host's /, their /tmp and file paths are rewritten to a private folder")
    if not use_net and network == "auto":
        _warn_once(f"local backend: no network namespaces ({why_net}); tasks use 127/8 "
                   "addresses on the host's loopback and ports bound on 0.0.0.0 can collide")
    return Isolation(bwrap=use_bwrap, netns=use_net)


def _combined_fails(python: str) -> bool:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trainyard-probe-") as tmp:
        net = ensure_group_network(Path(tmp), python=python, idle_s=0.5)
        try:
            return probe_bwrap(net.join_argv()[:-1]) is not None
        finally:
            proctree.send([p for p in (_proc(net.keeper_pid), _proc(net.ns_pid)) if p],
                          signal.SIGKILL)


def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def gpu_count() -> int:
    """How many real GPUs this machine has (``pools.real_gpu_count``: ``nvidia-smi -L``)."""
    return real_gpu_count()


def loopback_address(workflow_id: str, task: str) -> str:
    """A stable 127/8 address for a task (never 127.0.0.x, never a .0 or .255 host part)."""
    digest = hashlib.sha256(f"{workflow_id}\0{task}".encode()).digest()
    return f"127.{1 + digest[0] % 254}.{digest[1]}.{1 + digest[2] % 254}"


# ---------------------------------------------------------------------- requests


@dataclass(frozen=True)
class GroupRequest:
    """One gang's start on this machine: its launches and the isolation probed for them.

    The per-task ``LaunchRequest`` is built when it is sent, with the GPUs lent and the
    group's network namespace made then; ``render()`` builds each one without those (no
    GPU, no namespace path, no API token) for the dry run.
    """

    launches: list[TaskLaunch]
    iso: Isolation
    preview: Callable[[TaskLaunch], str]

    def render(self) -> str:
        """Each task's runner command, sandbox command prefix and run file, for a person."""
        return "\n".join(self.preview(launch) for launch in self.launches)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# ---------------------------------------------------------------------- attempts


@dataclass
class _Attempt:
    key: TaskKey
    run_dir: Path | None
    pid: int | None = None
    created: float = 0.0
    offset: int = 0
    reported: bool = False
    done: bool = False
    stopping: bool = False
    stop_deadline: float = 0.0
    termed: bool = False
    forced: bool = False  # kill(): SIGKILL at once, no SIGTERM
    force_sent: bool = False  # a hosted runner was told to kill its command
    stopped: bool = False
    next_alive_check: float = 0.0
    gpus: tuple[int, ...] = ()  # machine-wide indices of the real GPUs it borrowed
    hosted: str | None = None  # the launcher's name when a thread of it runs the runner
    container: str | None = None  # the podman container's name, removed when it ends


class GpuLeases:
    """This machine's real GPUs (``gpu_count``), each lent to at most one live task attempt.

    One per process (``_GPUS``), shared by every local backend object: the virtual nodes of
    a pool, and the local pools, all share this machine. A lease ends with ``give_back``, or
    by itself once its attempt is done or its runner is gone (an attempt that nobody polls
    any more). Thread-safe.
    """

    def __init__(self) -> None:
        self._holders: dict[int, _Attempt] = {}
        self._lock = threading.Lock()

    def lend(self, attempt: _Attempt, count: int) -> tuple[int, ...]:
        """Lend ``attempt`` up to ``count`` free GPUs, lowest index first; fewer (down to
        none) when fewer are free. Returns their machine-wide indices."""
        with self._lock:
            self._prune()
            free = [d for d in range(gpu_count()) if d not in self._holders]
            lent = tuple(free[:max(count, 0)])
            self._holders.update(dict.fromkeys(lent, attempt))
            return lent

    def hold(self, attempt: _Attempt, gpus: tuple[int, ...]) -> None:
        """Record that ``attempt`` (adopted by ``recover``) uses ``gpus``."""
        with self._lock:
            self._holders.update(dict.fromkeys(gpus, attempt))

    def give_back(self, attempt: _Attempt) -> None:
        """End every lease of ``attempt``'s key. Idempotent."""
        with self._lock:
            for gpu in [g for g, a in self._holders.items() if a.key == attempt.key]:
                del self._holders[gpu]

    def lent(self) -> dict[int, TaskKey]:
        """Each GPU lent now, with the attempt holding it."""
        with self._lock:
            self._prune()
            return {gpu: a.key for gpu, a in sorted(self._holders.items())}

    def _prune(self) -> None:
        gone = [g for g, a in self._holders.items()
                if a.done or (a.pid is not None and not _runner_lives(a))]
        for gpu in gone:
            del self._holders[gpu]


_GPUS = GpuLeases()


def _runner_lives(attempt: _Attempt) -> bool:
    """Whether the attempt's runner lives: its process; or, hosted, the launcher and the
    thread (which leaves ``ENDED`` in the run folder as it ends)."""
    if attempt.pid is None:
        return False
    if attempt.hosted and attempt.run_dir is not None and (attempt.run_dir / ENDED).exists():
        return False
    return proctree.same_process(attempt.pid, attempt.created) is not None


@dataclass
class _Start:
    """One task's start, prepared (``LocalBackend._prepare_start``) and then sent: its
    ``run_many`` entry, and what the launcher answered (``result``: pid and create time of
    the process that runs it and whether ``launch.json`` was written, or why it did not
    start; None until answered)."""

    launch: TaskLaunch
    attempt: _Attempt
    message: dict[str, Any]
    result: tuple[int, float, bool] | BackendError | None = None


START_BATCH = 32
"""Most task starts in one ``run_many`` request (a gang is never split: it may exceed it)."""


class _Sender:
    """Sends prepared starts to the launcher in ``run_many`` requests, from a thread of its
    own while the caller prepares the next ones (``threaded``), else at once: whatever was
    queued while the launcher answered the last request goes in the next one (whole gangs,
    up to ``START_BATCH`` tasks). A request that fails fails each of its starts with that
    reason. Leaving the ``with`` block waits until every start sent has its answer."""

    def __init__(self, launcher: LauncherClient, env: dict[str, str], *, threaded: bool) -> None:
        self._launcher = launcher
        self._env = env
        self._queue: queue.SimpleQueue[list[_Start] | None] = queue.SimpleQueue()
        self._thread = (threading.Thread(target=self._loop, name="local-starts", daemon=True)
                        if threaded else None)

    def __enter__(self) -> _Sender:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def send(self, starts: list[_Start]) -> None:
        """Send one gang's starts (now, or with the next request of the sender thread)."""
        if self._thread is None:
            self._deliver(starts)
        else:
            self._queue.put(starts)

    def _loop(self) -> None:
        done = False
        while not done:
            batch = [self._queue.get()]
            while batch[-1] is not None and sum(len(g or []) for g in batch) < START_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            done = batch[-1] is None
            starts = [start for gang in batch if gang for start in gang]
            if starts:
                self._deliver(starts)

    def _deliver(self, starts: list[_Start]) -> None:
        try:
            results = self._launcher.run_many([s.message for s in starts], self._env)
        except Exception as exc:  # noqa: BLE001 - every start must get an answer
            error = exc if isinstance(exc, BackendError) else BackendError(
                f"{type(exc).__name__}: {exc}")
            results = [error] * len(starts)
        for start, result in zip(starts, results, strict=True):
            start.result = result


class LocalBackend(Backend[GroupRequest]):
    """Runs tasks as sandboxed processes on this machine (see module docstring).

    Args:
        pool: the pool (its ``images`` and ``options``); default: the ``local`` pool's settings.
        home: ``$TRAINYARD_HOME`` (default ``trainyard_home()``).
        state_dir: the backend's own folder (default ``<home>/local``).
        sandbox, network, forward_ports, stop_grace_s: override the pool's options.
        python: the interpreter that runs the runner (default: this one).
    """

    name = "local"

    def __init__(self, pool: Pool | None = None, home: Path | None = None, *,
                 state_dir: Path | None = None, sandbox: str | None = None,
                 network: str | None = None, forward_ports: list[int] | None = None,
                 stop_grace_s: float | None = None, python: str | None = None) -> None:
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
        self._attempts: dict[TaskKey, _Attempt] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopper: threading.Thread | None = None
        self.limits = bool(options.get("limits", True))
        self.pids_max = int(options.get("pids_max", DEFAULT_PIDS_MAX))
        self.insecure_registries: tuple[str, ...] = tuple(
            registry_host(str(r)) for r in options.get("insecure_registries", []))
        """Registries pulled from without TLS verification (podman's ``--tls-verify=false``):
        the pool option ``insecure_registries`` (``host:port`` each), as registries.conf's
        ``insecure = true``."""
        idle = float(options.get("launcher_idle_s", 60.0))
        self._launcher = LauncherClient(self.state_dir, self.python, idle_s=idle)
        self._facts_socket: FactsSocket | None = None
        self._facts_name = hashlib.sha256((pool.name if pool else "").encode()).hexdigest()[:12]

    # ------------------------------------------------------------------ Backend API

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
        the launcher between them (issue 11; the engine hands one gang at a time since it
        measured slower with several, see the module docstring). This thread
        prepares each gang's starts (folders, ``run.json``, the index entry) while a sender
        thread (``_Sender``) hands the ones prepared so far to the launcher in one
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
        sent: list[tuple[int, list[_Start]]] = []
        with _Sender(self._launcher, self._runner_env(), threaded=len(requests) > 1) as sender:
            for index, request in enumerate(requests):
                launches = request.launches
                if not launches:
                    continue
                try:
                    starts = self._prepare_group(launches, request.iso)
                except (OSError, BackendError, ValueError) as exc:
                    results[index] = _group_error(launches, exc)
                    continue
                sender.send(starts)
                sent.append((index, starts))
        for index, starts in sent:
            results[index] = self._finish_group(requests[index].launches, starts)
        return results

    def poll(self) -> list[TaskFact]:
        """Facts since the last call: runner events, each once, and LOST/START_ERROR for a
        runner gone without reporting its exit."""
        with self._lock:
            attempts = [a for a in self._attempts.values() if not a.done]
        facts: list[TaskFact] = []
        ended: list[_Attempt] = []
        for attempt in attempts:
            facts += self._poll_one(attempt)
            if attempt.done:
                _GPUS.give_back(attempt)
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
            log.info("runners' events are read at the engine's tick: no socket at %s (%s)",
                     path, exc)
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
                attempt = self._attempts.get(key) or self._load(key) or _Attempt(key, None)
                self._attempts[key] = attempt
                if self._alive(attempt) and not _has_exit(attempt):
                    _GPUS.hold(attempt, attempt.gpus)
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
            raise RefusedError(f"task {key.task} (retry {key.retry_id}) has no running "
                               "process on this machine")
        init = find_sandbox_init(attempt.pid, attempt.created, attempt.run_dir)
        return {"backend": "local", "machine": machine_id(), "pid": init.pid,
                "created": init.create_time(), "address": self.host_of(key, ""),
                "run_dir": str(attempt.run_dir)}

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

    # ------------------------------------------------------------------ building requests

    def _preview(self, launch: TaskLaunch, iso: Isolation) -> str:
        """One task of a dry run: the runner's command, the prefix its command runs under
        and its run file, as ``build_task_request`` makes them without GPUs, the group's
        namespace path or an API token. A podman task's container is only named (its image
        is inspected and its root prepared at start)."""
        key = launch.key
        head = f"# task {key.task} (retry {key.retry_id}) on node {launch.node}"
        if self._podman_for(runtime_for(launch.run.get("image"), self.images)):
            return f"{head}: podman container of image {launch.run.get('image')}"
        request = self.build_task_request(launch, iso, with_token=False)
        run = request.run
        return "\n".join([
            head, f"$ {shlex.join(request.argv)}",
            f"# the command runs under: {shlex.join(run.sandbox.command_prefix) or '(nothing)'}",
            f"# {request.run_dir / 'run.json'}:", run.model_dump_json(indent=2)])

    def build_task_request(self, launch: TaskLaunch, iso: Isolation,
                           net: GroupNetwork | None = None, gpus: tuple[int, ...] = (), *,
                           with_token: bool = True) -> LaunchRequest:
        """Turn one launch into the command line and runner input (no side effects but
        the probes, which are cached).

        Args:
            gpus: machine-wide indices of the real GPUs lent to the task (``GpuLeases``);
                they become its ``CUDA_VISIBLE_DEVICES`` (empty: none visible).
            with_token: put the task's API URL and token in its environment (not in a dry run).
        """
        run = TaskRun.model_validate(launch.run)
        run_dir = Path(launch.run_dir)
        runtime = runtime_for(run.image, self.images)
        podman = self._podman_for(runtime)
        run.sandbox = SandboxSettings(
            path_prepend=runtime_path(runtime, self.state_dir),
            env=self._task_env(run, iso, gpus, with_token),
            description=self._describe(launch, iso, image_note(
                run.image, runtime, None if podman else self._why_no_podman())),
            summary=self._summarize(launch, iso, image_summary(
                run.image, runtime, None if podman else self._why_no_podman())),
            limits=self.task_limits(launch))
        request = LaunchRequest(launch.key, run_dir, [], run, run_dir / "sandbox" / "root")
        request.registry_credentials = launch.registry_credentials
        request.writable_dirs = self._writable_dirs(run)
        remap = not (net is not None and net.user_ns and not run.host_network)
        box = strategy_for(podman, iso.bwrap).sandbox(
            self, request, remap=remap, net=net if iso.netns else None, gpus=gpus)
        request.hosts_text, request.plan = box.hosts_text, box.plan
        run.sandbox = run.sandbox.model_copy(update=box.settings)
        if not box.network_by_path:
            self._join_network(request, iso, net)
        request.argv = [self.python, "-m", "trainyard.runner", str(run_dir / "run.json")]
        return request

    def _join_network(self, request: LaunchRequest, iso: Isolation,
                      net: GroupNetwork | None) -> None:
        """How the task gets into its group's network namespace: none for
        ``hostNetwork``; a hosted runner's thread moved there by the launcher (as root);
        else ``nsenter`` put before the sandbox prefix."""
        run = request.run
        request.hosted = hostable(run)
        if run.host_network:
            return  # the host's network namespace: nothing to join
        if iso.netns and net is None and request.hosted and _holds_namespaces():
            request.joins_group_network = True
        elif iso.netns and net is not None:
            prefix = net.join_argv() + run.sandbox.command_prefix
            run.sandbox.command_prefix = prefix
            if run.sandbox.userns is not None:
                run.sandbox.userns = run.sandbox.userns.model_copy(
                    update={"args_at": bwrap_end(prefix)})

    def task_limits(self, launch: TaskLaunch) -> TaskLimits | None:
        """The task's limits from its spec's resources (memory, cpu: a pod's requests as
        limits) and the pool's ``pids_max``; None where the pool says ``limits: false``."""
        if not self.limits:
            return None
        return TaskLimits(memory_bytes=launch.resources.memory_bytes, cpu=launch.resources.cpu,
                          pids_max=self.pids_max)

    def _task_env(self, run: TaskRun, iso: Isolation, gpus: tuple[int, ...],
                  with_token: bool = True) -> dict[str, str]:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}
        if with_token:
            env.update(task_api_env(self.home, run.workflow_id))  # URL and a task token
        if iso.netns:
            for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if name not in run.environment:
                    env[name] = "lo"
        return env

    def _summarize(self, launch: TaskLaunch, iso: Isolation, image: str) -> str:
        """The task log's one-line header: node, isolation, what runs (``_describe`` says
        it all, in the detail lines)."""
        runtime = runtime_for(launch.run.get("image"), self.images)
        fs = ("podman container" if self._podman_for(runtime) else
              "bubblewrap sandbox" if iso.bwrap else "no sandbox")
        return f"{launch.node}, {fs}, {image}"

    def _describe(self, launch: TaskLaunch, iso: Isolation, image: str = "") -> str:
        runtime = runtime_for(launch.run.get("image"), self.images)
        if self._podman_for(runtime):
            nested = ("" if container.PODMAN_SECCOMP.is_file() else
                      f"; nested user namespaces allowed: no {container.PODMAN_SECCOMP} to "
                      "build a seccomp profile from")
            fs = (f"podman container of image {launch.run.get('image')} (root inside is the "
                  f"host's nobody, no capabilities{nested})")
        else:
            why_not = probe_remap() if iso.bwrap else None
            uid = ("root inside is the host's nobody" if why_not is None
                   else f"root inside is the host's root, secrets covered; no uid remap: {why_not}")
            fs = ("bubblewrap sandbox (own writable /, pid/ipc/uts/user namespaces, no "
                  f"capabilities, {uid})" if iso.bwrap
                  else "no sandbox (/tmp and file paths rewritten to a private folder)")
        if launch.run.get("host_network"):
            netw = "the host's network (hostNetwork: true)"
        elif iso.netns:
            netw = f"network namespace of the group, {self._egress_text()}"
        else:
            netw = "host network (loopback addresses)"
        host = loopback_address(launch.key.workflow_id, launch.key.task)
        line = f"local backend on {launch.node}: {fs}; {netw}; address {host}"
        return f"{line}\n{image}" if image else line

    # ------------------------------------------------------------------ egress, hostNetwork, images

    def _egress_on(self) -> bool:
        """Whether group namespaces get egress: the pool allows it and pasta works here
        (probed once per process, ``_why_no_egress``)."""
        return self.egress and _why_no_egress() is None

    def _egress_text(self) -> str:
        if not self.egress:
            return "no egress (pool egress: false)"
        why_not = _why_no_egress()
        if why_not is not None:
            return f"no egress ({why_not})"
        no_router = probe_router()
        if no_router is None:
            return ("egress through pasta behind the launcher's egress router (a veth to it, "
                    "no route to other groups)")
        return f"egress through pasta of its own (no egress router: {no_router})"

    def _check_host_network(self, launches: list[TaskLaunch]) -> None:
        """A task asking ``hostNetwork: true`` on a pool that does not allow it is refused
        (the submission check refuses it first; this guards specs stored before)."""
        asked = [launch.key.task for launch in launches if launch.run.get("host_network")]
        if asked and not self.allow_host_network:
            raise BackendError(f"task(s) {', '.join(asked)} ask hostNetwork: true, which this "
                               "pool does not allow (allow_host_network: true in pools.yaml)")

    def _needs_group_network(self, launches: list[TaskLaunch], iso: Isolation) -> bool:
        """Whether some task joins the group's namespace by its path (``nsenter``, podman's
        ``--network ns:``) rather than in the launcher or not at all (``hostNetwork``)."""
        if not iso.netns:
            return False
        return any(not launch.run.get("host_network") and (
            self._podman_for(runtime_for(launch.run.get("image"), self.images))
            or not _joins_in_launcher(launch, iso)) for launch in launches)

    def _why_no_podman(self) -> str | None:
        return container.probe_podman()

    def _podman_for(self, runtime: str) -> bool:
        """Whether a task of this image runtime runs as a podman container here."""
        return runtime == container.RUNTIME and self._why_no_podman() is None

    def _writable_dirs(self, run: TaskRun) -> list[Path]:
        dirs = [Path(run.run_dir), run.output_path]
        dirs += [run.input_path(i) for i in range(len(run.inputs))]
        if run.barrier.enabled and run.barrier.folder:
            dirs.append(Path(run.barrier.folder))
        return dirs

    def volumes(self, run: TaskRun) -> tuple[tuple[str, str], ...]:
        """``(host folder, path inside)`` of each ``volumeMounts`` entry, checked again
        against the pool's ``allowed_mounts`` (a backend made without a pool trusts the spec
        layer's check).

        Raises:
            BackendError: a mount the pool does not allow, or one onto ``/``, ``/proc``,
                ``/dev`` or ``/sys``.
        """
        found = []
        for value in run.volume_mounts:
            host, inside = split_mount(value)
            allowed = self.allowed_mounts
            if allowed is not None and not any(_inside(host, a) for a in allowed):
                raise BackendError(f"volume mount {value!r}: {host} is not in the pool's "
                                   f"options.{ALLOWED_MOUNTS_OPTION} ({', '.join(allowed) or 'none'})")
            if inside == "/" or any(_inside(inside, f"/{t}") for t in ("proc", "dev", "sys")):
                raise BackendError(f"volume mount {value!r}: cannot mount onto {inside}; "
                                   "choose a path such as /mnt/NAME")
            found.append((host, inside))
        return tuple(found)

    def _server_url(self) -> str | None:
        return server_url_for_tasks(self.home)

    def _forwarded_ports(self) -> list[int]:
        ports = list(self.forward_ports)
        server = self._server_url()
        if server:
            parsed = urlparse(server)
            if parsed.hostname in ("127.0.0.1", "localhost") and parsed.port:
                ports.append(parsed.port)
        return sorted(set(ports))

    def _group_network(self, launch: TaskLaunch) -> GroupNetwork:
        return self._launcher.network(_group_key(launch), self._forwarded_ports(),
                                      self._egress_on())

    # ------------------------------------------------------------------ starting

    def _prepare_group(self, launches: list[TaskLaunch], iso: Isolation) -> list[_Start]:
        """Everything of one gang's start but the launcher's part: the group's namespace
        when a task joins it by path, then each task's ``_prepare_start``. Nothing is lent
        if one task cannot be prepared."""
        self._check_host_network(launches)
        net = (self._group_network(launches[0])
               if self._needs_group_network(launches, iso) else None)
        starts: list[_Start] = []
        try:
            for launch in launches:
                starts.append(self._prepare_start(launch, iso, net))
        except BaseException:
            for start in starts:
                _GPUS.give_back(start.attempt)
            raise
        return starts

    def _prepare_start(self, launch: TaskLaunch, iso: Isolation,
                       net: GroupNetwork | None) -> _Start:
        """One task's start up to the launcher: its files taken over (RESTART), real GPUs
        lent, its request built, the index entry written (first: write-ahead), its folders
        and ``run.json`` made. The GPUs are given back if it cannot be prepared."""
        if launch.restart_in_place:
            self._adopt_files(launch.key, Path(launch.run_dir))
        attempt = _Attempt(launch.key, Path(launch.run_dir))
        attempt.gpus = self._lend_gpus(attempt, launch)
        try:
            request = self.build_task_request(launch, iso, net, attempt.gpus)
            self.index.write(request.key, {"run_dir": str(request.run_dir)})
            self._prepare(request)
        except BaseException:
            _GPUS.give_back(attempt)
            raise
        mode = "thread" if request.hosted else "process"
        attempt.hosted = self._launcher.name if request.hosted else None
        attempt.container = (container.container_name(request.run_dir)
                             if request.run.sandbox.env_flag else None)
        network = ({"group": _group_key(launch), "forward": self._forwarded_ports(),
                    "egress": self._egress_on()} if request.joins_group_network else None)
        message = {
            "run_json": str(request.run_dir / "run.json"), "out": str(request.run_dir / RUNNER_OUT),
            "cwd": str(request.run_dir), "group": _group_key(launch), "mode": mode,
            "network": network, "launch_json": str(request.run_dir / LAUNCH),
            "launch": {"argv": request.argv, "group": launch.group, "gpus": list(attempt.gpus),
                       "hosted_by": attempt.hosted, "container": attempt.container}}
        return _Start(launch, attempt, message)

    def _record(self, start: _Start) -> BackendError | None:
        """Write the attempt's ``launch.json`` where the launcher could not; a start that
        cannot be recorded fails its gang (it would be lost to an engine restart)."""
        try:
            write_json(Path(start.message["launch_json"]),
                        {**start.message["launch"], "pid": start.attempt.pid,
                         "created": start.attempt.created})
        except OSError as exc:
            return BackendError(f"task {start.launch.key.task}: cannot record its start: {exc}")
        return None

    def _lend_gpus(self, attempt: _Attempt, launch: TaskLaunch) -> tuple[int, ...]:
        gpus = _GPUS.lend(attempt, len(launch.gpu_slots))
        real = gpu_count()
        if real and len(gpus) < len(launch.gpu_slots):
            log.warning("task %s: %d GPU slots but %d of this machine's %d GPUs free; the rest "
                        "run as CPU", launch.key.task, len(launch.gpu_slots), len(gpus), real)
        return gpus

    def _finish_group(self, launches: list[TaskLaunch], starts: list[_Start]) -> BackendError | None:
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
                _GPUS.give_back(start.attempt)
                failed = failed or start.result or BackendError("the start was never sent")
        if failed is None:
            return None
        self.stop(started)
        return _group_error(launches, failed)

    def _prepare(self, request: LaunchRequest) -> None:
        request.run_dir.mkdir(parents=True, exist_ok=True)
        events = request.run_dir / EVENTS
        if events.exists():  # a run_dir used again: old events must not be reported
            events.rename(request.run_dir / f"events.{time.time_ns()}.jsonl")
        (request.run_dir / ENDED).unlink(missing_ok=True)
        if request.plan is not None:
            for path in clear_links(request.plan):
                log.warning("task %s: removed %s, a link or file the task left where its "
                            "sandbox mounts a folder", request.key.task, path)
        tmp = request.root_dir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o1777)
        # OSMO's workspace: bound into a podman task; a sandbox's is its own (PRIVATE_DIRS)
        (request.root_dir / OSMO_WORKSPACE.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for folder in request.writable_dirs:
            folder.mkdir(parents=True, exist_ok=True)
        if request.hosts_text is not None:
            # Read by the task's root, the host's nobody: 0644 whatever the server's umask
            # (077); it names the group's tasks and addresses, nothing secret.
            hosts = request.run_dir / "sandbox" / "hosts"
            hosts.write_text(request.hosts_text)
            hosts.chmod(0o644)
        write_json(request.run_dir / "run.json", request.run.model_dump(mode="json"))

    def _adopt_files(self, key: TaskKey, run_dir: Path) -> None:
        """RESTART in place: move the task's files into ``run_dir``, each folder from the
        latest earlier attempt that has it: ``sandbox`` (its ``/``, ``/tmp`` and files) and
        ``output`` (its ``{{output}}``). A folder ``run_dir`` already has is left alone."""
        for name in ADOPTED:
            earlier = self._earlier_folder(key, name)
            if earlier is not None and not (run_dir / name).exists():
                run_dir.mkdir(parents=True, exist_ok=True)
                earlier.rename(run_dir / name)

    def _earlier_folder(self, key: TaskKey, name: str) -> Path | None:
        """``<run_dir>/<name>`` of the latest earlier attempt of the task that has it."""
        for retry in range(key.retry_id - 1, -1, -1):
            earlier = self._load(TaskKey(key.workflow_id, key.task, retry))
            if earlier is not None and earlier.run_dir and (earlier.run_dir / name).is_dir():
                return earlier.run_dir / name
        return None

    def _load(self, key: TaskKey) -> _Attempt | None:
        """An attempt known from the index (started by an earlier backend object)."""
        record = self.index.read(key)
        try:
            run_dir = Path(record["run_dir"]) if record is not None else None
        except (KeyError, TypeError):
            return None
        if run_dir is None:
            return None
        try:
            launch = json.loads((run_dir / LAUNCH).read_text())
            return _Attempt(key, run_dir, int(launch["pid"]), float(launch["created"]),
                            gpus=tuple(int(g) for g in launch.get("gpus", ())),
                            hosted=launch.get("hosted_by"), container=launch.get("container"))
        except (OSError, ValueError, KeyError, TypeError):
            return _Attempt(key, run_dir)

    # ------------------------------------------------------------------ observing

    def _alive(self, attempt: _Attempt) -> bool:
        return _runner_lives(attempt)

    def _read(self, attempt: _Attempt) -> list[TaskFact]:
        if attempt.run_dir is None:
            return []
        facts, attempt.offset = read_facts(attempt.key, attempt.run_dir, attempt.offset)
        attempt.reported = attempt.reported or bool(facts)
        return facts

    def _poll_one(self, attempt: _Attempt) -> list[TaskFact]:
        # Whether the runner lives is asked before its events are read (an exit between the
        # two must not look like a loss), and at most every ALIVE_CHECK_S: a poll of many
        # running tasks then mostly reads files.
        now = time.monotonic()
        alive = True
        if now >= attempt.next_alive_check:
            attempt.next_alive_check = now + ALIVE_CHECK_S
            alive = self._alive(attempt)
        facts = self._read(attempt)
        if not any(f.kind is FactKind.EXITED for f in facts) and not alive:
            facts.append(self._vanished(attempt))
        if facts and facts[-1].kind in ENDING:
            attempt.done = True
        return facts

    def _vanished(self, attempt: _Attempt) -> TaskFact:
        if attempt.run_dir is None:
            return TaskFact(attempt.key, FactKind.LOST, time.time(), None,
                            "no record of this attempt on this machine")
        last = tail(attempt.run_dir / RUNNER_OUT)
        kind = FactKind.LOST if attempt.reported else FactKind.START_ERROR
        message = "the task runner ended without reporting an exit"
        if attempt.hosted and proctree.same_process(attempt.pid or 0, attempt.created) is None:
            message = (f"the launcher (pid {attempt.pid}) that ran the task runner as a thread "
                       "died, and the task's sandbox with it")
        return TaskFact(attempt.key, kind, time.time(), None,
                        f"{message}: {last}" if last else message)

    # ------------------------------------------------------------------ stopping

    def _members(self, attempt: _Attempt) -> list[psutil.Process]:
        if attempt.pid is None:
            return []
        found: dict[int, psutil.Process] = {}
        top = proctree.same_process(attempt.pid, attempt.created)
        if top is not None:
            found[top.pid] = top
            found.update((p.pid, p) for p in proctree.descendants(top))
        found.update((p.pid, p) for p in proctree.session_members(attempt.pid, attempt.created))
        return list(found.values())

    def _kill_leftovers(self, attempts: list[_Attempt]) -> None:
        """SIGKILL what ended attempts left: their runners' trees and sessions (one scan of
        the process table for all of them). A hosted runner's sandbox ends with its thread;
        but when the launcher died, what is left of its session goes too (a sandbox it was
        starting as it died may not have asked for ``--die-with-parent`` yet)."""
        leaders = {a.pid: a.created for a in attempts if a.pid is not None and (
            not a.hosted or proctree.same_process(a.pid, a.created) is None)}
        proctree.send(proctree.leftovers(leaders), signal.SIGKILL)

    def _ensure_stopper(self) -> None:
        if self._stopper is None or not self._stopper.is_alive():
            self._stopper = threading.Thread(target=self._stop_loop, name="local-stopper",
                                             daemon=True)
            self._stopper.start()

    def _stop_loop(self) -> None:
        while True:
            with self._lock:
                pending = [a for a in self._attempts.values()
                           if a.stopping and not a.stopped and a.pid]
            busy = [a for a in pending if self._advance_stop(a)]
            self._wake.wait(0.1 if busy else 1.0)
            self._wake.clear()

    def _advance_stop(self, attempt: _Attempt) -> bool:
        """One step of stopping; returns False once nothing of the attempt is left."""
        if attempt.hosted:
            return self._advance_hosted_stop(attempt)
        members = self._members(attempt)
        if not members:
            attempt.stopped = True
            return False
        if not attempt.termed:
            runner = [p for p in members if p.pid == attempt.pid]
            attempt.termed = proctree.send(runner, signal.SIGTERM) > 0
        if time.monotonic() >= attempt.stop_deadline:
            proctree.send(members, signal.SIGKILL)
        return True


    def _advance_hosted_stop(self, attempt: _Attempt) -> bool:
        """A hosted runner stops itself (``Runner.request_stop``: SIGTERM, then SIGKILL of
        its command after the grace); the sandbox takes the rest of the task with it."""
        if not attempt.termed or (attempt.forced and not attempt.force_sent):
            attempt.termed = True
            attempt.force_sent = attempt.forced
            assert attempt.run_dir is not None and attempt.hosted is not None
            self._launcher.stop_hosted(attempt.run_dir, attempt.hosted, force=attempt.forced)
        if self._alive(attempt):
            return True
        self._kill_leftovers([attempt])
        attempt.stopped = True
        return False


@functools.lru_cache(maxsize=1)
def _why_no_egress() -> str | None:
    """Why group namespaces get no egress here (``netns.probe_egress_attach``, once per
    process; warns once), or None."""
    why_not = probe_egress_attach()
    if why_not is not None:
        _warn_once(f"local backend: no egress for tasks ({why_not}); they reach only their "
                   "group and the forwarded ports")
    return why_not


def _holds_namespaces() -> bool:
    """Whether the launcher holds group namespaces as descriptors (as root, see
    ``backends.local.launcher``), which a hosted runner's thread can join."""
    return os.geteuid() == 0


def _joins_in_launcher(launch: TaskLaunch, iso: Isolation) -> bool:
    """Whether ``build_request`` will have the launcher join the task's runner thread to the
    group's namespace (``LaunchRequest.joins_group_network``): ``runner.hosted.hostable``
    (sandboxed, no data to move), read from the launch, as root."""
    moves_data = any(launch.run.get(field) for field in DATA_FIELDS)
    return iso.bwrap and not moves_data and _holds_namespaces()


def _has_exit(attempt: _Attempt) -> bool:
    """Whether the attempt's runner already reported EXITED (it may still be exiting)."""
    if attempt.run_dir is None:
        return False
    events, _ = read_events(attempt.run_dir / EVENTS)
    return any(e.kind == FactKind.EXITED.value for e in events)


def _group_key(launch: TaskLaunch) -> str:
    """The launcher's name for a task's group (its namespace and lifetime)."""
    return f"{launch.key.workflow_id}/{launch.group}"


def _group_error(launches: list[TaskLaunch], exc: BaseException) -> BackendError:
    return BackendError(f"local backend could not start group {launches[0].group!r}: {exc}")


def _choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"local backend option {name}: expected one of "
                          f"{', '.join(choices)}, got {value!r}")
    return value


def create(pool: Pool, home: Path) -> LocalBackend:
    """Registry entry: the local backend for ``pool`` with state under ``home``."""
    return LocalBackend(pool, home)
