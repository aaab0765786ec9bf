"""A gang whose Slurm job waits in Slurm's queue says why (issue 28): the job's pending
reason (squeue %r) becomes its group's waiting reason in the store, which query, --wait,
``-f json`` and the dashboard show (``engine.reasons.waits_of``). On the real test cluster,
with a job that cannot start now (``--begin`` an hour away: it holds no node, so it never
delays another test's job), then cancelled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster_support import EngineRunner

from trainyard.engine import reasons
from trainyard.pools import Pool
from trainyard.status import WorkflowStatus

pytest_plugins = ["slurm_fixtures"]

SPEC = """
workflow:
  name: queued
  tasks:
  - name: t
    command: [echo, never]
"""


@pytest.fixture
def later_engine(slurm_pool: Pool, runner_home: Path, tmp_path: Path) -> Iterator[EngineRunner]:
    """An engine on a copy of the cluster's pool whose jobs may begin only in an hour."""
    options = {**slurm_pool.options, "sbatch_args": ["--begin=now+3600"], "status_interval_s": 0.2}
    pool = slurm_pool.model_copy(update={"name": "slurm-later", "options": options})
    home = tmp_path / "home"
    home.mkdir()
    runner = EngineRunner(home, pool)
    yield runner
    runner.close()


def test_a_pending_jobs_reason_is_its_groups_waiting_reason(
    later_engine: EngineRunner, tmp_path: Path
) -> None:
    spec = tmp_path / "queued.yaml"
    spec.write_text(SPEC)
    wid = later_engine.submit_spec(spec)
    deadline = time.monotonic() + 60
    while not (later_engine.state(wid).groups["t"].waiting_reason or "").startswith(
        "task t: Slurm job"
    ):
        assert time.monotonic() < deadline, later_engine.state(wid).groups["t"]
        time.sleep(0.2)
    state = later_engine.state(wid)
    why = state.groups["t"].waiting_reason or ""
    assert "is PENDING (BeginTime): its start time has not come yet" in why, why
    assert [(w["group"], w["reason"]) for w in reasons.waits_of(state)] == [("t", why)]
    later_engine.engine.cancel(wid)
    assert later_engine.wait(wid, timeout_s=120).status == WorkflowStatus.FAILED_CANCELED
