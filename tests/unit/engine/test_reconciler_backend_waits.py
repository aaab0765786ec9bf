"""A gang placed on a pool whose backend queues it (Slurm's queue, Kubernetes' scheduler)
gets the backend's waiting reason as its group's (issue 28): the engine asks
``Backend.waiting_reason`` of a placed gang none of whose tasks started. Fake backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainyard.backends.base import TaskFact, TaskKey
from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine import steploop
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.store import Store

POOL = Pool(name="local", nodes=[NodeSpec(name="n0")])
WHY = "Slurm job 7 is PENDING (Resources): it waits for resources to be free"


class _Queued(FakeBackend):
    """Accepts the start; nothing starts until ``release``; says why meanwhile."""

    def __init__(self) -> None:
        super().__init__(lambda launch: Outcome(0))
        self.held = True
        self.asked: list[TaskKey] = []

    def poll(self) -> list[TaskFact]:
        return [] if self.held else super().poll()

    def waiting_reason(self, key: TaskKey) -> str:
        self.asked.append(key)
        return WHY if self.held else ""


def test_the_backends_reason_becomes_the_groups_until_a_task_starts(
    tmp_path: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steploop, "WAIT_REASONS_INTERVAL_S", 0.0)
    backend = _Queued()
    engine = Engine(
        Store(store_url), tmp_path, pools={"local": POOL}, backend_factory=lambda p, h: backend
    )
    spec = WorkflowSpec.model_validate({"name": "q", "tasks": [{"name": "t", "command": ["true"]}]})
    wid = engine.submit(Submission(spec=spec, spec_text="", user="alice", pool=POOL)).id
    for _ in range(3):
        engine.step()
    group = engine.state(wid).groups["t"]
    assert group.status.value == "INITIALIZING" and group.waiting_reason == f"task t: {WHY}"
    backend.held = False
    assert engine.wait(wid, 10).status == "COMPLETED"
    assert engine.state(wid).groups["t"].waiting_reason is None
