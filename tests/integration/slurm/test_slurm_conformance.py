"""OSMO's "Must reach the outcome" rows that need no object store, through the engine on the
Slurm test cluster, side by side with the local backend: same workflow outcome, same task
statuses, the logs the row checks.

Every row is submitted to both engines at once (module fixture), so the module takes about as
long as its longest row (exec_timeout: 2 minutes).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from slurm_cluster_support import SPECS, EngineRunner

from trainyard.engine.status import WorkflowStatus

pytest_plugins = ["slurm_fixtures"]

if not SPECS.is_dir():
    pytest.skip(f"OSMO conformance specs not found at {SPECS}", allow_module_level=True)

TIMEOUTS = {WorkflowStatus.FAILED_EXEC_TIMEOUT, WorkflowStatus.FAILED_QUEUE_TIMEOUT}


@dataclass(frozen=True)
class Row:
    """One row of EXPECTATIONS.md "Must reach the outcome"."""

    id: str
    spec: str
    sets: tuple[str, ...]
    outcome: str  # COMPLETED, FAILED or TIMEOUT
    logs: tuple[tuple[str, str], ...] = ()  # (task, text its log must contain)


ROWS = [  # short rows first: the long ones then do not hold the queue
    Row("hello_world", "tutorials/hello_world.yaml", (), "COMPLETED",
        (("hello", "Hello from OSMO!"),)),
    Row("serial_workflow", "tutorials/serial_workflow.yaml", (), "COMPLETED",
        (("task3", "a line: Data from task 2"),)),
    Row("serial_workflow_vars", "tests/serial_workflow.yaml", (), "COMPLETED"),
    # The client connects once, without retrying, as soon as the barrier lets it: whether the
    # server listens by then is a race on any backend, so the row checks the address it was
    # given (a node's NodeAddr); test_slurm_jobs.py checks a retrying client gets the reply.
    Row("group_tasks_communication", "tutorials/group_tasks_communication.yaml", (), "COMPLETED",
        (("client", "Calling server at 127.0.0."),)),
    Row("parallel_workflow_leader_exits", "tests/parallel_workflow_leader_exits.yaml", (), "FAILED"),
    Row("exit_actions_complete", "tests/exit_actions.yaml", (), "COMPLETED", (("test", "hello"),)),
    Row("exit_actions_fail", "tests/exit_actions.yaml", ("code=1",), "FAILED"),
    Row("group_actions_fail", "tests/group_actions.yaml", ("ignore_nonlead_status=false",), "FAILED"),
    Row("group_actions_ignore", "tests/group_actions.yaml", ("ignore_nonlead_status=true",),
        "COMPLETED"),
    Row("exec_timeout", "tests/exec_timeout.yaml", (), "TIMEOUT"),
]


def _outcome(status: str) -> str:
    status = WorkflowStatus(status)
    if status in TIMEOUTS:
        return "TIMEOUT"
    return "COMPLETED" if status is WorkflowStatus.COMPLETED else "FAILED"


@pytest.fixture(scope="module")
def submitted(slurm_engine: EngineRunner, local_engine: EngineRunner) -> dict[str, tuple[str, str]]:
    """Row id -> (Slurm workflow id, local workflow id)."""
    out = {}
    for row in ROWS:
        path = SPECS / row.spec
        out[row.id] = (slurm_engine.submit_spec(path, row.sets),
                       local_engine.submit_spec(path, row.sets))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_reaches_the_same_outcome_as_locally(row: Row, submitted: dict[str, tuple[str, str]],
                                                 slurm_engine: EngineRunner,
                                                 local_engine: EngineRunner) -> None:
    slurm_id, local_id = submitted[row.id]
    slurm_record = slurm_engine.wait(slurm_id, timeout_s=600)
    local_record = local_engine.wait(local_id, timeout_s=600)
    assert _outcome(slurm_record.status) == row.outcome, slurm_engine.state(slurm_id)
    assert slurm_record.status == local_record.status
    slurm_tasks = {n: t.status for n, t in slurm_engine.state(slurm_id).tasks.items()}
    local_tasks = {n: t.status for n, t in local_engine.state(local_id).tasks.items()}
    assert slurm_tasks == local_tasks
    for task, text in row.logs:
        assert text in slurm_engine.log(slurm_id, task)
