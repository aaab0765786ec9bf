"""``PodJudge``: an attempt's facts from its pod's latest state (``states.view_of``), a pod
gone without an ending as LOST after ``lost_grace_s`` (EXITED 143 when stopped here), and
with ``scheduler: none`` a gang not all running within ``gang_timeout_s`` ended whole (3005).

Design: docs/kubernetes.md, "Module: `src/trainyard/backends/kubernetes/backend.py`".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from trainyard.backends.base import FactKind, TaskFact, TaskKey
from trainyard.backends.kubernetes.logs import PodLogs
from trainyard.backends.kubernetes.options import KubernetesOptions
from trainyard.backends.kubernetes.states import view_of
from trainyard.backends.kubernetes.watch import PodWatch
from trainyard.status import STOPPED_EXIT_CODE, ExitCode

__all__ = ["Attempt", "PodJudge"]

log = logging.getLogger("trainyard.backends.kubernetes")


@dataclass
class Attempt:
    """One task attempt run as pod ``pod``, as this backend knows it."""

    key: TaskKey
    pod: str
    start: str  # the gang start (PodGroup name) it belongs to
    sent_s: float  # time.monotonic() of its start
    started: bool = False
    done: bool = False
    stopping: bool = False
    gone_since: float | None = None
    waiting: str = ""


class PodJudge:
    """Turns pods' states into their attempts' facts, each once (it marks the attempts).

    Args:
        options: the pool's options (``lost_grace_s``, ``scheduler``, ``gang_timeout_s``).
        logs: the pods' logs: followed once a pod runs, kept when it ends, dropped when gone.
        delete_pod: ``delete_pod(name, grace_s)`` deletes a pod (best effort).
    """

    def __init__(
        self,
        options: KubernetesOptions,
        logs: PodLogs,
        delete_pod: Callable[[str, int | None], None],
    ) -> None:
        self.options = options
        self.logs = logs
        self._delete_pod = delete_pod

    def facts_of(self, attempt: Attempt, watch: PodWatch, now: float) -> list[TaskFact]:
        """The attempt's new facts from its pod's latest state in ``watch``: INITIALIZING and
        RUNNING once its task container runs, then its ending. While the watch is not
        healthy a missing pod proves nothing. ``now`` is ``time.monotonic()`` (s)."""
        pod = watch.get(attempt.pod)
        if pod is None:
            if not watch.healthy:  # the API cannot be reached: nothing is known
                attempt.gone_since = None
                return []
            return self._facts_of_missing(attempt, now)
        attempt.gone_since = None
        view = view_of(pod)
        facts = []
        if view.started and not attempt.started:
            attempt.started = True
            self.logs.follow(watch.api, attempt.pod, attempt.key)
            stamp = time.time()
            facts += [
                TaskFact(attempt.key, FactKind.INITIALIZING, stamp),
                TaskFact(attempt.key, FactKind.RUNNING, stamp),
            ]
        if view.waiting != attempt.waiting:
            attempt.waiting = view.waiting
            if view.waiting:
                log.info("kubernetes backend: pod %s waits: %s", attempt.pod, view.waiting)
        if view.ending is not None:
            attempt.done = True
            self.logs.keep(watch.api, attempt.pod, attempt.key)
            facts.append(
                TaskFact(attempt.key, view.ending, time.time(), view.exit_code, view.message)
            )
        return facts

    def _facts_of_missing(self, attempt: Attempt, now: float) -> list[TaskFact]:
        """A pod missing from the watch: EXITED 143 if stopped here, else LOST after
        ``lost_grace_s``."""
        if attempt.gone_since is None:
            attempt.gone_since = now
        if now - attempt.gone_since < self.options.lost_grace_s:
            return []
        attempt.done = True
        self.logs.drop(attempt.pod)
        if attempt.stopping:
            return [
                TaskFact(
                    attempt.key,
                    FactKind.EXITED,
                    time.time(),
                    STOPPED_EXIT_CODE,
                    "stopped: its pod was deleted",
                )
            ]
        view = view_of(None)
        return [
            TaskFact(
                attempt.key, FactKind.LOST, time.time(), None, f"pod {attempt.pod}: {view.message}"
            )
        ]

    def gang_timeouts(self, attempts: list[Attempt], now: float) -> list[TaskFact]:
        """``scheduler: none``: every start among ``attempts`` whose pods are not all running
        within ``gang_timeout_s`` of its first is deleted whole; its live attempts exit with
        OSMO's 3005 (START_TIMEOUT: the engine's FAILED_START_TIMEOUT). ``now`` is
        ``time.monotonic()`` (s)."""
        if self.options.scheduler != "none":
            return []
        starts: dict[str, list[Attempt]] = {}
        for attempt in attempts:
            starts.setdefault(attempt.start, []).append(attempt)
        facts = []
        for start, members in starts.items():
            late = now - min(a.sent_s for a in members) > self.options.gang_timeout_s
            live = [a for a in members if not a.done]
            if late and live and not all(a.started for a in members):
                facts += self._end_gang(start, live)
        return facts

    def _end_gang(self, start: str, live: list[Attempt]) -> list[TaskFact]:
        """Delete the live pods of gang ``start`` at once; each exits with START_TIMEOUT."""
        message = (
            f"gang {start}: not all its pods ran within gang_timeout_s="
            f"{self.options.gang_timeout_s:g} s; deleted so that it holds nothing"
        )
        log.warning("kubernetes backend: %s", message)
        facts = []
        for attempt in live:
            attempt.done = True
            self.logs.drop(attempt.pod)
            self._delete_pod(attempt.pod, 0)
            facts.append(
                TaskFact(
                    attempt.key, FactKind.EXITED, time.time(), int(ExitCode.START_TIMEOUT), message
                )
            )
        return facts
