"""A held long poll (``WorkflowReads.query_when_changed``) answers when the engine stores a change,
not at its own look interval (issue 15): the look interval is 60 s here and no engine loop
runs (steps are made by hand), so an answer within seconds came from
``Engine.wait_for_change``. Fake backend, real SQLite store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.server.auth import User
from trainyard.server.service import Service
from trainyard.server.workflow_reads import progress_key
from trainyard.spec.models import WorkflowSpec
from trainyard.store import Store

POOL = Pool(name="local", nodes=[NodeSpec(name="n0", gpu=8)])
SPEC = WorkflowSpec.model_validate({"name": "w", "tasks": [{"name": "t", "command": ["true"]}]})
LOOK_S = 60.0
SOON_S = 10.0  # far below the look interval, far above a step on a loaded 2-core machine


def test_a_held_query_answers_at_the_stored_change(tmp_path: Path) -> None:
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db.sqlite'}"),
        tmp_path,
        pools={"local": POOL},
        backend_factory=lambda p, h: FakeBackend(lambda launch: Outcome(None)),
    )
    alice = User("alice")
    wid = engine.submit(Submission(spec=SPEC, spec_text="", user=alice.name, pool=POOL)).id
    service = Service(engine)
    known = progress_key(engine.state(wid))
    timer = threading.Timer(0.3, engine.step)  # places and starts the task: a change
    timer.start()
    started = time.monotonic()
    data, key = service.reads.query_when_changed(
        wid, alice, known=known, wait_s=LOOK_S, interval_s=LOOK_S
    )
    took_s = time.monotonic() - started
    timer.join()
    assert key != known and data["status"] != "PENDING"
    assert 0.25 <= took_s < SOON_S, took_s
