"""A Slurm backend failure says why (issue 12): sbatch refuses the job (a partition Slurm
does not have) and the task ends FAILED_BACKEND_ERROR (3001) with sbatch's own words in its
``failure_reason`` (stored, shown by ``workflow query``) and in its task log, not only in
server.log. On the real test cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster_support import EngineRunner

from trainyard.pools import Pool
from trainyard.server.shapes import task_json
from trainyard.status import Status, WorkflowStatus

pytest_plugins = ["slurm_fixtures"]

SPEC = """
workflow:
  name: refused
  tasks:
  - name: t
    command: [echo, never]
"""


@pytest.fixture
def refused_engine(slurm_pool: Pool, runner_home: Path, tmp_path: Path) -> Iterator[EngineRunner]:
    """An engine on a copy of the cluster's pool whose partition Slurm does not have."""
    options = {**slurm_pool.options, "partition": "no-such-partition"}
    pool = slurm_pool.model_copy(update={"name": "slurm-refused", "options": options})
    home = tmp_path / "home"
    home.mkdir()
    runner = EngineRunner(home, pool)
    yield runner
    runner.close()


def test_sbatch_refusing_the_job_is_the_tasks_failure_reason(
    refused_engine: EngineRunner, tmp_path: Path
) -> None:
    spec = tmp_path / "refused.yaml"
    spec.write_text(SPEC)
    wid = refused_engine.submit_spec(spec)
    assert refused_engine.wait(wid, timeout_s=120).status == WorkflowStatus.FAILED
    task = refused_engine.state(wid).tasks["t"]
    assert (task.status, task.exit_code) == (Status.FAILED_BACKEND_ERROR, 3001)
    assert task.failure_reason is not None
    assert "sbatch exited" in task.failure_reason
    assert "partition" in task.failure_reason.lower()  # sbatch's stderr, as Slurm wrote it
    log = refused_engine.log(wid, "t")
    assert "[t][trainyard] the slurm backend could not start the task: " in log
    assert all(line in log for line in task.failure_reason.splitlines())
    assert task_json(task, verbose=False)["failure_reason"] == task.failure_reason
