"""A scripted in-memory backend for fast engine tests (STYLE.md #9: ship the fakes).

Each started attempt reports INITIALIZING and RUNNING on the next poll, then EXITED after
``polls`` more polls with the code the script gives; a script returning ``None`` for the
code makes the attempt run until stopped. Stopped attempts report EXITED 143 (SIGTERM).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainyard.backends.base import Backend, FactKind, TaskFact, TaskKey, TaskLaunch
from trainyard.errors import BackendError
from trainyard.status import STOPPED_EXIT_CODE  # what a stopped attempt reports

__all__ = ["FakeBackend", "FakeRequest", "Outcome"]


@dataclass(frozen=True)
class Outcome:
    """How a scripted attempt ends: ``exit_code`` after ``polls`` polls (None: never)."""

    exit_code: int | None = 0
    polls: int = 1


@dataclass
class _Attempt:
    launch: TaskLaunch
    outcome: Outcome
    age: int = 0
    reported: list[FactKind] = field(default_factory=list)
    done: bool = False
    stopping: bool = False


@dataclass(frozen=True)
class FakeRequest:
    """A gang start of the fake backend: the launches, nothing to show for a dry run."""

    launches: list[TaskLaunch]

    def render(self) -> str:
        """Empty: a scripted start has no command to show."""
        return ""


class FakeBackend(Backend[FakeRequest]):
    """Backend whose tasks are scripted, not run. ``launches`` records every start."""

    name = "fake"

    def __init__(
        self,
        script: Callable[[TaskLaunch], Outcome] | None = None,
        *,
        refuse_start: Callable[[list[TaskLaunch]], bool] | None = None,
    ) -> None:
        self.script = script or (lambda _launch: Outcome())
        self.refuse_start = refuse_start or (lambda _launches: False)
        self.launches: list[TaskLaunch] = []
        self.stopped: list[TaskKey] = []
        self._attempts: dict[TaskKey, _Attempt] = {}

    def build_request(self, launches: list[TaskLaunch]) -> FakeRequest:
        return FakeRequest(list(launches))

    def send(self, request: FakeRequest) -> None:
        launches = request.launches
        if self.refuse_start(launches):
            raise BackendError("fake backend refused the group")
        for launch in launches:
            self.launches.append(launch)
            self._attempts[launch.key] = _Attempt(launch, self.script(launch))

    def poll(self) -> list[TaskFact]:
        facts = []
        for key, attempt in self._attempts.items():
            facts += self._advance(key, attempt)
        return facts

    def _advance(self, key: TaskKey, attempt: _Attempt) -> list[TaskFact]:
        if attempt.done:
            return []
        now = time.time()
        if attempt.stopping:
            attempt.done = True
            return [TaskFact(key, FactKind.EXITED, now, exit_code=STOPPED_EXIT_CODE)]
        if not attempt.reported:
            attempt.reported = [FactKind.INITIALIZING, FactKind.RUNNING]
            return [TaskFact(key, FactKind.INITIALIZING, now), TaskFact(key, FactKind.RUNNING, now)]
        attempt.age += 1
        code = attempt.outcome.exit_code
        if code is None or attempt.age < attempt.outcome.polls:
            return []
        attempt.done = True
        return [TaskFact(key, FactKind.EXITED, now, exit_code=code)]

    def stop(self, keys: list[TaskKey]) -> None:
        for key in keys:
            attempt = self._attempts.get(key)
            if attempt is not None and not attempt.done and not attempt.stopping:
                attempt.stopping = True  # EXITED 143 on the next poll, as a runner reports
                self.stopped.append(key)

    def host_of(self, key: TaskKey, node: str) -> str:
        return f"{key.task}.{key.workflow_id}.fake"

    def recover(self, keys: list[TaskKey]) -> list[TaskKey]:
        return [
            k
            for k in keys
            if k in self._attempts and not self._attempts[k].done and not self._attempts[k].stopping
        ]

    def unstarted(self, keys: list[TaskKey]) -> list[TaskKey]:
        """Those of ``keys`` this fake was never asked to start."""
        return [k for k in keys if k not in self._attempts]

    def close(self) -> None:
        """Nothing to release."""
