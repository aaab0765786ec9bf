"""The launcher's client side of a start: each task's files and ``run_many`` message prepared
(write-ahead: the index entry first), then sent in batches by ``Sender`` while the next gang
is prepared; the launcher records each start in the attempt's ``launch.json``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainyard.backends.attempts import write_json
from trainyard.backends.base import TaskLaunch
from trainyard.backends.local import container
from trainyard.backends.local.isolation import LaunchRequest
from trainyard.backends.local.launcher import LauncherClient
from trainyard.backends.local.messages import NetworkSpec, RunSpec
from trainyard.backends.local.netns import GroupNetwork
from trainyard.backends.local.probe import Isolation
from trainyard.backends.local.request import RequestBuilder, group_key
from trainyard.backends.local.sandbox import OSMO_WORKSPACE, clear_links
from trainyard.backends.local.tracking import GPUS, LAUNCH, RUNNER_OUT, Attempt, AttemptTracker
from trainyard.errors import BackendError
from trainyard.runner.hosted import ENDED
from trainyard.runner.report import EVENTS

__all__ = ["START_BATCH", "Sender", "Start", "StartPreparer", "group_error"]

log = logging.getLogger("trainyard.backends.local")


@dataclass
class Start:
    """One task's start, prepared (``LocalBackend._prepare_start``) and then sent: its
    ``run_many`` entry, and what the launcher answered (``result``: pid and create time of
    the process that runs it and whether ``launch.json`` was written, or why it did not
    start; None until answered)."""

    launch: TaskLaunch
    attempt: Attempt
    message: RunSpec
    result: tuple[int, float, bool] | BackendError | None = None


START_BATCH = 32
"""Most task starts in one ``run_many`` request (a gang is never split: it may exceed it)."""


class Sender:
    """Sends prepared starts to the launcher in ``run_many`` requests, from a thread of its
    own while the caller prepares the next ones (``threaded``), else at once: whatever was
    queued while the launcher answered the last request goes in the next one (whole gangs,
    up to ``START_BATCH`` tasks). A request that fails fails each of its starts with that
    reason. Leaving the ``with`` block waits until every start sent has its answer."""

    def __init__(self, launcher: LauncherClient, env: dict[str, str], *, threaded: bool) -> None:
        self._launcher = launcher
        self._env = env
        self._queue: queue.SimpleQueue[list[Start] | None] = queue.SimpleQueue()
        self._thread = (
            threading.Thread(target=self._loop, name="local-starts", daemon=True)
            if threaded
            else None
        )

    def __enter__(self) -> Sender:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()

    def send(self, starts: list[Start]) -> None:
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

    def _deliver(self, starts: list[Start]) -> None:
        try:
            results = self._launcher.run_many([s.message for s in starts], self._env)
        except Exception as exc:  # noqa: BLE001 - every start must get an answer
            error = (
                exc
                if isinstance(exc, BackendError)
                else BackendError(f"{type(exc).__name__}: {exc}")
            )
            results = [error] * len(starts)
        for start, result in zip(starts, results, strict=True):
            start.result = result


def group_error(launches: list[TaskLaunch], exc: BaseException) -> BackendError:
    """The error of a gang that could not start, naming the group."""
    return BackendError(f"local backend could not start group {launches[0].group!r}: {exc}")


class StartPreparer(AttemptTracker, RequestBuilder):
    """Prepares a gang's starts up to the launcher (a base of ``LocalBackend``)."""

    def _prepare_group(self, launches: list[TaskLaunch], iso: Isolation) -> list[Start]:
        """Everything of one gang's start but the launcher's part: the group's namespace
        when a task joins it by path, then each task's ``_prepare_start``. Nothing is lent
        if one task cannot be prepared."""
        self._check_host_network(launches)
        net = self._group_network(launches[0]) if self._needs_group_network(launches, iso) else None
        starts: list[Start] = []
        try:
            for launch in launches:
                starts.append(self._prepare_start(launch, iso, net))
        except BaseException:
            for start in starts:
                GPUS.give_back(start.attempt)
            raise
        return starts

    def _prepare_start(self, launch: TaskLaunch, iso: Isolation, net: GroupNetwork | None) -> Start:
        """One task's start up to the launcher: its files taken over (RESTART), real GPUs
        lent, its request built, the index entry written (first: write-ahead), its folders
        and ``run.json`` made. The GPUs are given back if it cannot be prepared."""
        if launch.restart_in_place:
            self._adopt_files(launch.key, Path(launch.run_dir))
        attempt = Attempt(launch.key, Path(launch.run_dir))
        attempt.gpus = self._lend_gpus(attempt, launch)
        try:
            request = self.build_task_request(launch, iso, net, attempt.gpus)
            self.index.write(request.key, {"run_dir": str(request.run_dir)})
            self._write_run_files(request)
        except BaseException:
            GPUS.give_back(attempt)
            raise
        mode: Literal["process", "thread"] = "thread" if request.hosted else "process"
        attempt.hosted = self._launcher.name if request.hosted else None
        attempt.container = (
            container.container_name(request.run_dir) if request.run.sandbox.env_flag else None
        )
        network = (
            NetworkSpec(
                group=group_key(launch),
                forward=self._forwarded_ports(),
                egress=self._egress_on(),
            )
            if request.joins_group_network
            else None
        )
        message = RunSpec(
            run_json=str(request.run_dir / "run.json"),
            out=str(request.run_dir / RUNNER_OUT),
            cwd=str(request.run_dir),
            group=group_key(launch),
            mode=mode,
            network=network,
            launch_json=str(request.run_dir / LAUNCH),
            launch={
                "argv": request.argv,
                "group": launch.group,
                "gpus": list(attempt.gpus),
                "hosted_by": attempt.hosted,
                "container": attempt.container,
            },
        )
        return Start(launch, attempt, message)

    def _record(self, start: Start) -> BackendError | None:
        """Write the attempt's ``launch.json`` where the launcher could not; a start that
        cannot be recorded fails its gang (it would be lost to an engine restart)."""
        try:
            write_json(
                Path(str(start.message.launch_json)),
                {
                    **start.message.launch,
                    "pid": start.attempt.pid,
                    "created": start.attempt.created,
                },
            )
        except OSError as exc:
            return BackendError(f"task {start.launch.key.task}: cannot record its start: {exc}")
        return None

    def _write_run_files(self, request: LaunchRequest) -> None:
        request.run_dir.mkdir(parents=True, exist_ok=True)
        events = request.run_dir / EVENTS
        if events.exists():  # a run_dir used again: old events must not be reported
            events.rename(request.run_dir / f"events.{time.time_ns()}.jsonl")
        (request.run_dir / ENDED).unlink(missing_ok=True)
        if request.plan is not None:
            for path in clear_links(request.plan):
                log.warning(
                    "task %s: removed %s, a link or file the task left where its "
                    "sandbox mounts a folder",
                    request.key.task,
                    path,
                )
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
