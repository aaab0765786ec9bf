"""A pool whose backend cannot be made (an option its backend refuses, a missing tool) ends
its workflow's tasks FAILED_BACKEND_ERROR with the reason, instead of leaving them
INITIALIZING while every engine step fails on it (found with a Slurm pool carrying an option
the Slurm backend's strict check refused). Real SQLite store, the engine's own loop."""

from __future__ import annotations

import threading
from pathlib import Path

from trainyard.backends.base import Backend
from trainyard.engine.reconciler import Engine, Submission
from trainyard.errors import ConfigError
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import Status
from trainyard.store import Store

POOL = Pool(name="broken", nodes=[NodeSpec(name="n0", gpu=8)])
SPEC = WorkflowSpec.model_validate({"name": "w", "tasks": [{"name": "t", "command": ["true"]}]})


def refuse(pool: Pool, home: Path) -> Backend:
    raise ConfigError(f"pool {pool.name!r}: option 'frobnicate' is not a Slurm option")


def test_a_backend_that_cannot_be_made_fails_the_workflow_with_the_reason(
    tmp_path: Path, store_url: str
) -> None:
    engine = Engine(
        Store(store_url),
        tmp_path,
        pools={"broken": POOL},
        backend_factory=refuse,
        poll_interval_s=0.02,
    )
    stop = threading.Event()
    loop = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
    loop.start()
    try:
        wid = engine.submit(Submission(spec=SPEC, spec_text="", user="u", pool=POOL)).id
        record = engine.wait(wid, timeout_s=60)
    finally:
        stop.set()
        loop.join(timeout=10)
    assert record.status == Status.FAILED.value
    task = engine.state(wid).tasks["t"]
    assert task.status is Status.FAILED_BACKEND_ERROR
    assert "frobnicate" in (task.failure_reason or "") and "'broken'" in task.failure_reason
