"""The local backend's attempts: what it keeps of each (``Attempt``), the machine's real GPUs
lent to them (``GpuLeases``), reading their facts, and stopping them (SIGTERM, then SIGKILL of
the whole tree after ``stop_grace_s``). The index of attempts is ``backends.attempts``.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from trainyard.backends.attempts import AttemptIndex, tail
from trainyard.backends.base import FactKind, TaskFact, TaskKey, TaskLaunch
from trainyard.backends.facts import ENDING, read_facts
from trainyard.backends.local.launcher import LauncherClient
from trainyard.linux import proctree
from trainyard.pools import real_gpu_count
from trainyard.runner.hosted import ENDED
from trainyard.runner.report import EVENTS, read_events

__all__ = [
    "ADOPTED",
    "ALIVE_CHECK_S",
    "Attempt",
    "AttemptTracker",
    "GPUS",
    "GpuLeases",
    "LAUNCH",
    "RUNNER_OUT",
    "gpu_count",
    "has_exit",
    "runner_lives",
]

log = logging.getLogger("trainyard.backends.local")

RUNNER_OUT = "runner.out"
"""The runner's own stdout and stderr, in its run folder (its last lines explain a LOST)."""
LAUNCH = "launch.json"
"""Where the launcher records a start (pid, create time, GPUs), in the run folder."""
ADOPTED = ("sandbox", "output")
"""Folders of a run_dir that a RESTART in place takes over from the attempt before."""
ALIVE_CHECK_S = 0.5
"""How often ``poll`` asks whether a runner still lives (a LOST fact comes that much later)."""


def gpu_count() -> int:
    """How many real GPUs this machine has (``pools.real_gpu_count``: ``nvidia-smi -L``)."""
    return real_gpu_count()


@dataclass
class Attempt:
    """One attempt of a task on this machine, as this backend object tracks it."""

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

    One per process (``GPUS``), shared by every local backend object: the virtual nodes of
    a pool, and the local pools, all share this machine. A lease ends with ``give_back``, or
    by itself once its attempt is done or its runner is gone (an attempt that nobody polls
    any more). Thread-safe.
    """

    def __init__(self) -> None:
        self._holders: dict[int, Attempt] = {}
        self._lock = threading.Lock()

    def lend(self, attempt: Attempt, count: int) -> tuple[int, ...]:
        """Lend ``attempt`` up to ``count`` free GPUs, lowest index first; fewer (down to
        none) when fewer are free. Returns their machine-wide indices."""
        with self._lock:
            self._prune()
            free = [d for d in range(gpu_count()) if d not in self._holders]
            lent = tuple(free[: max(count, 0)])
            self._holders.update(dict.fromkeys(lent, attempt))
            return lent

    def hold(self, attempt: Attempt, gpus: tuple[int, ...]) -> None:
        """Record that ``attempt`` (adopted by ``recover``) uses ``gpus``."""
        with self._lock:
            self._holders.update(dict.fromkeys(gpus, attempt))

    def give_back(self, attempt: Attempt) -> None:
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
        gone = [
            g
            for g, a in self._holders.items()
            if a.done or (a.pid is not None and not runner_lives(a))
        ]
        for gpu in gone:
            del self._holders[gpu]


GPUS = GpuLeases()


def runner_lives(attempt: Attempt) -> bool:
    """Whether the attempt's runner lives: its process; or, hosted, the launcher and the
    thread (which leaves ``ENDED`` in the run folder as it ends)."""
    if attempt.pid is None:
        return False
    if attempt.hosted and attempt.run_dir is not None and (attempt.run_dir / ENDED).exists():
        return False
    return proctree.same_process(attempt.pid, attempt.created) is not None


def has_exit(attempt: Attempt) -> bool:
    """Whether the attempt's runner already reported EXITED (it may still be exiting)."""
    if attempt.run_dir is None:
        return False
    events, _ = read_events(attempt.run_dir / EVENTS)
    return any(e.kind == FactKind.EXITED.value for e in events)


class AttemptTracker:
    """Reads, adopts and stops the attempts of one ``LocalBackend`` (a base of it: the
    attributes below are set by its ``__init__``)."""

    index: AttemptIndex
    stop_grace_s: float
    _attempts: dict[TaskKey, Attempt]
    _lock: threading.RLock
    _wake: threading.Event
    _stopper: threading.Thread | None
    _launcher: LauncherClient

    def _lend_gpus(self, attempt: Attempt, launch: TaskLaunch) -> tuple[int, ...]:
        gpus = GPUS.lend(attempt, len(launch.gpu_slots))
        real = gpu_count()
        if real and len(gpus) < len(launch.gpu_slots):
            log.warning(
                "task %s: %d GPU slots but %d of this machine's %d GPUs free; the rest run as CPU",
                launch.key.task,
                len(launch.gpu_slots),
                len(gpus),
                real,
            )
        return gpus

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

    def _load(self, key: TaskKey) -> Attempt | None:
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
            return Attempt(
                key,
                run_dir,
                int(launch["pid"]),
                float(launch["created"]),
                gpus=tuple(int(g) for g in launch.get("gpus", ())),
                hosted=launch.get("hosted_by"),
                container=launch.get("container"),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return Attempt(key, run_dir)

    def _alive(self, attempt: Attempt) -> bool:
        return runner_lives(attempt)

    def _read(self, attempt: Attempt) -> list[TaskFact]:
        if attempt.run_dir is None:
            return []
        facts, attempt.offset = read_facts(attempt.key, attempt.run_dir, attempt.offset)
        attempt.reported = attempt.reported or bool(facts)
        return facts

    def _poll_one(self, attempt: Attempt) -> list[TaskFact]:
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

    def _vanished(self, attempt: Attempt) -> TaskFact:
        if attempt.run_dir is None:
            return TaskFact(
                attempt.key,
                FactKind.LOST,
                time.time(),
                None,
                "no record of this attempt on this machine",
            )
        last = tail(attempt.run_dir / RUNNER_OUT)
        kind = FactKind.LOST if attempt.reported else FactKind.START_ERROR
        message = "the task runner ended without reporting an exit"
        if attempt.hosted and proctree.same_process(attempt.pid or 0, attempt.created) is None:
            message = (
                f"the launcher (pid {attempt.pid}) that ran the task runner as a thread "
                "died, and the task's sandbox with it"
            )
        return TaskFact(
            attempt.key, kind, time.time(), None, f"{message}: {last}" if last else message
        )

    def _members(self, attempt: Attempt) -> list[psutil.Process]:
        if attempt.pid is None:
            return []
        found: dict[int, psutil.Process] = {}
        top = proctree.same_process(attempt.pid, attempt.created)
        if top is not None:
            found[top.pid] = top
            found.update((p.pid, p) for p in proctree.descendants(top))
        found.update((p.pid, p) for p in proctree.session_members(attempt.pid, attempt.created))
        return list(found.values())

    def _kill_leftovers(self, attempts: list[Attempt]) -> None:
        """SIGKILL what ended attempts left: their runners' trees and sessions (one scan of
        the process table for all of them). A hosted runner's sandbox ends with its thread;
        but when the launcher died, what is left of its session goes too (a sandbox it was
        starting as it died may not have asked for ``--die-with-parent`` yet)."""
        leaders = {
            a.pid: a.created
            for a in attempts
            if a.pid is not None
            and (not a.hosted or proctree.same_process(a.pid, a.created) is None)
        }
        proctree.send(proctree.leftovers(leaders), signal.SIGKILL)

    def _ensure_stopper(self) -> None:
        if self._stopper is None or not self._stopper.is_alive():
            self._stopper = threading.Thread(
                target=self._stop_loop, name="local-stopper", daemon=True
            )
            self._stopper.start()

    def _stop_loop(self) -> None:
        while True:
            with self._lock:
                pending = [
                    a for a in self._attempts.values() if a.stopping and not a.stopped and a.pid
                ]
            busy = [a for a in pending if self._advance_stop(a)]
            self._wake.wait(0.1 if busy else 1.0)
            self._wake.clear()

    def _advance_stop(self, attempt: Attempt) -> bool:
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

    def _advance_hosted_stop(self, attempt: Attempt) -> bool:
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
