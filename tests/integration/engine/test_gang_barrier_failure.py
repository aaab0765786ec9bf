"""Issue 12, M1: a non-lead whose input download fails (exit 2010) before its gang's barrier
released ends the gang at once (OSMO fails the group), through the real engine, the local
backend and real runners; the lead does not wait 600 s at the barrier and end with 2024."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard import spec
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import default_local_pool
from trainyard.status import ExitCode, Status, WorkflowStatus
from trainyard.store import Store

GANG = """
workflow:
  name: barrier-gang
  groups:
  - name: gang
    tasks:
    - name: lead
      lead: true
      command: [sh, -c, "echo lead ran; sleep 1"]
    - name: worker
      command: [sh, -c, "echo worker ran"]
      inputs:
      - task: "nobody-7:make"
"""

PROMPT_S = 60.0
"""Far below the runner's 600 s barrier timeout, far above a loaded machine's start time."""


@pytest.fixture
def engine(tmp_path: Path, store_url: str) -> Iterator[Engine]:
    home = tmp_path / "home dir"
    home.mkdir()
    pool = default_local_pool()
    made = Engine(Store(store_url), home, pools={pool.name: pool})
    stop = threading.Event()
    thread = threading.Thread(target=made.run_forever, args=(stop,), daemon=True)
    thread.start()
    yield made
    stop.set()
    thread.join(timeout=10)
    made.close()


def test_a_worker_whose_input_fails_ends_the_gang_at_once(engine: Engine) -> None:
    pool = default_local_pool()
    doc = spec.load(GANG, pool=pool)  # the worker's input: a task of a workflow that is not
    record = engine.submit(Submission(spec=doc.workflow, spec_text=GANG, user="tester", pool=pool))
    start = time.monotonic()
    engine.wait(record.id, timeout_s=PROMPT_S)
    took_s = time.monotonic() - start

    state = engine.state(record.id)
    worker, lead = state.tasks["worker"], state.tasks["lead"]
    assert state.status is WorkflowStatus.FAILED
    assert (worker.status, worker.exit_code) == (Status.FAILED, int(ExitCode.DOWNLOAD_FAILED))
    assert state.groups["gang"].status is Status.FAILED
    assert lead.status is Status.FAILED and lead.exit_code != int(ExitCode.BARRIER_FAILED)
    assert took_s < PROMPT_S
    lead_log = engine.run_dir(record.id, "lead", 0) / "task.log"
    assert "lead ran" not in (lead_log.read_text() if lead_log.exists() else "")
