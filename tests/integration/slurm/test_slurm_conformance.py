"""OSMO's "Must reach the outcome" rows that need no object store, through the engine on the
Slurm test cluster, side by side with the local backend: same workflow outcome, same task
statuses, the logs the row checks.

Every row is submitted to both engines at once (module fixture), so the module takes about as
long as its longest rows (exec_timeout and combination_workflow_complex: 2 minutes each). One
exception: Slurm tasks share their node's network (here all nodes are this machine), so rows
whose specs listen on the same fixed port take turns on Slurm, each submitted once the one
before has ended (tests/parallel_workflow_v2 and tutorials/group_tasks_communication: 24831).
On the local backend each group has its own network namespace.

Left out on Slurm, with the reason:
- tutorials/group_tasks.yaml: a group is one Slurm job with one node per task, and its three
  tasks need three nodes; the test cluster has two, so the spec is refused at submit, with
  that reason (``test_a_group_with_more_tasks_than_nodes_is_refused``).
- tests/osmo_client_test.yaml runs, but without a server: these engine-level tests start none,
  so the task's ``osmo version`` shows the CLI's own version only; the server line is checked
  on the local backend by tests/integration/cli/test_osmo_outcomes.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from slurm_cluster_support import SPECS, EngineRunner

from trainyard.errors import SpecError
from trainyard.status import WorkflowStatus

pytest_plugins = ["slurm_fixtures"]

if not SPECS.is_dir():
    pytest.skip(f"OSMO conformance specs not found at {SPECS}", allow_module_level=True)

Submitted = dict[str, tuple[Future[str], str]]
"""Row id -> (the Slurm workflow id once submitted, the local workflow id)."""
TIMEOUTS = {WorkflowStatus.FAILED_EXEC_TIMEOUT, WorkflowStatus.FAILED_QUEUE_TIMEOUT}


@dataclass(frozen=True)
class Row:
    """One row of EXPECTATIONS.md "Must reach the outcome"."""

    id: str
    spec: str
    sets: tuple[str, ...]
    outcome: str  # COMPLETED, FAILED or TIMEOUT
    logs: tuple[tuple[str, str], ...] = ()  # (task, text its log must contain)
    port: int | None = None  # a fixed port its tasks listen on: such rows take turns on Slurm


ROWS = [  # short rows first: the long ones then do not hold the queue
    Row(
        "hello_world",
        "tutorials/hello_world.yaml",
        (),
        "COMPLETED",
        (("hello", "Hello from OSMO!"),),
    ),
    Row(
        "template_hello_world",
        "tutorials/template_hello_world.yaml",
        ("workflow_name=greetings", "message=Custom message!"),
        "COMPLETED",
        (("hello", "Custom message!"),),
    ),
    Row(
        "token_example",
        "tutorials/token_example.yaml",
        (),
        "COMPLETED",
        (
            ("experiment", "Running experiment: my-experiment"),
            ("experiment", "Workflow ID: my-experiment-"),
        ),
    ),
    Row(
        "parallel_tasks",
        "tutorials/parallel_tasks.yaml",
        (),
        "COMPLETED",
        tuple((t, f"Hello from {t}") for t in ("task-a", "task-b", "task-c")),
    ),
    Row(
        "serial_workflow",
        "tutorials/serial_workflow.yaml",
        (),
        "COMPLETED",
        (("task3", "a line: Data from task 2"),),
    ),
    Row("serial_workflow_vars", "tests/serial_workflow.yaml", (), "COMPLETED"),
    Row(
        "parallel_workflow_v2",
        "tests/parallel_workflow_v2.yaml",
        (),
        "COMPLETED",
        (("client", "hello"),),
        port=24831,
    ),
    # The client connects once, without retrying, as soon as the barrier lets it: whether the
    # server listens by then is a race on any backend, so the row checks the address it was
    # given (a node's NodeAddr); test_slurm_jobs.py checks a retrying client gets the reply.
    Row(
        "group_tasks_communication",
        "tutorials/group_tasks_communication.yaml",
        (),
        "COMPLETED",
        (("client", "Calling server at 127.0.0."),),
        port=24831,
    ),
    # (train-model-b, not the lead, is often stopped before its command runs: the lead ends
    # first, on any backend)
    Row(
        "combination_workflow_simple",
        "tutorials/combination_workflow_simple.yaml",
        (),
        "COMPLETED",
        (("train-model-a", "sample_10,value_10"),),
    ),
    Row(
        "resources_basic",
        "tutorials/resources_basic.yaml",
        (),
        "COMPLETED",
        (("my-task", "Using default resources"),),
    ),
    Row(
        "data_filter",
        "tutorials/data_filter.yaml",
        ("storage_url={storage}",),
        "COMPLETED",
        (("selective-download", "keep.txt"),),
    ),
    Row(
        "osmo_client_test",
        "tests/osmo_client_test.yaml",
        (),
        "COMPLETED",
        (("task1", "Running osmo version"), ("task1", "trainyard ")),
    ),
    Row(
        "workflow_labels_ok",
        "scenarios/workflow_labels.yaml",
        ("exit_code=0",),
        "COMPLETED",
        (("labels", "workflow-labels scenario task"),),
    ),
    Row("workflow_labels_fail", "scenarios/workflow_labels.yaml", ("exit_code=1",), "FAILED"),
    Row(
        "parallel_workflow_leader_exits", "tests/parallel_workflow_leader_exits.yaml", (), "FAILED"
    ),
    Row("exit_actions_complete", "tests/exit_actions.yaml", (), "COMPLETED", (("test", "hello"),)),
    Row("exit_actions_fail", "tests/exit_actions.yaml", ("code=1",), "FAILED"),
    Row(
        "group_actions_fail", "tests/group_actions.yaml", ("ignore_nonlead_status=false",), "FAILED"
    ),
    Row(
        "group_actions_ignore",
        "tests/group_actions.yaml",
        ("ignore_nonlead_status=true",),
        "COMPLETED",
    ),
    Row(
        "combination_workflow_complex",
        "tutorials/combination_workflow_complex.yaml",
        (),
        "COMPLETED",
        (("combine", "=== UPPERCASE VERSION ==="), ("combine", "CHERRY"), ("combine", "3\tcherry")),
    ),
    Row("exec_timeout", "tests/exec_timeout.yaml", (), "TIMEOUT"),
]


def _outcome(status: str) -> str:
    status = WorkflowStatus(status)
    if status in TIMEOUTS:
        return "TIMEOUT"
    return "COMPLETED" if status is WorkflowStatus.COMPLETED else "FAILED"


@pytest.fixture(scope="module")
def storage(data_root: Path) -> Path:
    """``storage_url`` of tutorials/data_filter.yaml: source-data/ with .txt, .json, .bin,
    below the engines' data root."""
    root = data_root / "data-filter"
    (root / "source-data").mkdir(parents=True)
    for name, text in (("keep.txt", "text\n"), ("skip.json", "{}\n"), ("skip.bin", "bin\n")):
        (root / "source-data" / name).write_text(text)
    return root


def _done(value: str) -> Future[str]:
    future: Future[str] = Future()
    future.set_result(value)
    return future


def _after(runner: EngineRunner, first: Future[str], path: Path, sets: tuple[str, ...]) -> str:
    """Submit once the workflow ``first`` has ended; the workflow id."""
    runner.wait(first.result(), timeout_s=600)
    return runner.submit_spec(path, sets)


@pytest.fixture(scope="module")
def submitted(
    slurm_engine: EngineRunner, local_engine: EngineRunner, storage: Path
) -> Iterator[Submitted]:
    """Every row submitted to both engines; on Slurm, a row whose port an earlier row
    listens on is submitted by a helper thread once that row has ended."""
    out: Submitted = {}
    on_port: dict[int, Future[str]] = {}
    with ThreadPoolExecutor(max_workers=1) as turns:
        for row in ROWS:
            path = SPECS / row.spec
            sets = tuple(value.format(storage=storage.as_uri()) for value in row.sets)
            first = on_port.get(row.port) if row.port else None
            slurm_id = (
                turns.submit(_after, slurm_engine, first, path, sets)
                if first
                else _done(slurm_engine.submit_spec(path, sets))
            )
            if row.port:
                on_port[row.port] = slurm_id
            out[row.id] = (slurm_id, local_engine.submit_spec(path, sets))
        yield out


@pytest.mark.slow
@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_reaches_the_same_outcome_as_locally(
    row: Row, submitted: Submitted, slurm_engine: EngineRunner, local_engine: EngineRunner
) -> None:
    slurm_id, local_id = submitted[row.id][0].result(), submitted[row.id][1]
    slurm_record = slurm_engine.wait(slurm_id, timeout_s=600)
    local_record = local_engine.wait(local_id, timeout_s=600)
    assert _outcome(slurm_record.status) == row.outcome, slurm_engine.state(slurm_id)
    assert slurm_record.status == local_record.status
    slurm_tasks = {n: t.status for n, t in slurm_engine.state(slurm_id).tasks.items()}
    local_tasks = {n: t.status for n, t in local_engine.state(local_id).tasks.items()}
    assert slurm_tasks == local_tasks
    for task, text in row.logs:
        assert text in slurm_engine.log(slurm_id, task)


@pytest.mark.slow
def test_data_filter_takes_only_the_matching_inputs(
    submitted: Submitted, slurm_engine: EngineRunner
) -> None:
    slurm_id = submitted["data_filter"][0].result()
    slurm_engine.wait(slurm_id, timeout_s=600)
    log = slurm_engine.log(slurm_id, "selective-download")
    assert "keep.txt" in log
    assert "skip.json" not in log and "skip.bin" not in log


@pytest.mark.slow
def test_labels_are_stored_and_filterable(submitted: Submitted, slurm_engine: EngineRunner) -> None:
    ids = {submitted[r][0].result() for r in ("workflow_labels_ok", "workflow_labels_fail")}
    for workflow_id in ids:
        slurm_engine.wait(workflow_id, timeout_s=600)
    store = slurm_engine.engine.store
    assert {r.id for r in store.list_workflows(labels={"policy-yaml": "from-yaml"})} == ids
    assert all(store.get_workflow(i).labels == {"policy-yaml": "from-yaml"} for i in ids)


@pytest.mark.slow
def test_the_lead_ending_stops_the_sleeping_client(
    submitted: Submitted, slurm_engine: EngineRunner
) -> None:
    slurm_id = submitted["parallel_workflow_v2"][0].result()
    slurm_engine.wait(slurm_id, timeout_s=600)
    tasks = slurm_engine.state(slurm_id).tasks.values()
    start = min(t.start_time_s for t in tasks if t.start_time_s)
    end = max(t.end_time_s or 0 for t in tasks)
    assert end - start < 90, [(t.name, t.start_time_s, t.end_time_s) for t in tasks]  # sleep 1000


def test_a_group_with_more_tasks_than_nodes_is_refused(slurm_engine: EngineRunner) -> None:
    with pytest.raises(SpecError) as refused:
        slurm_engine.submit_spec(SPECS / "tutorials/group_tasks.yaml")
    assert "has 3 tasks but pool 'slurm-local' has 2 nodes" in str(refused.value)
