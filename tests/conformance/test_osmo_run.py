"""OSMO's "Must reach the outcome" rows (shared/osmo-specs/EXPECTATIONS.md) that need no object
store, run for real on the local backend through the engine's Python API.

Every row is submitted first and then awaited together, so the module takes about as long as
its slowest row (exec_timeout and the 2-minute sleeps). The CLI end-to-end suite runs the same
rows through ``trainyard workflow submit --wait``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainyard import spec
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import default_local_pool
from trainyard.store import Store

SPECS = (Path(__file__).resolve().parents[2] / ".." / "shared" / "osmo-specs").resolve()
if not SPECS.is_dir():
    pytest.skip(
        f"OSMO conformance specs not found at {SPECS} (shared/ must sit beside the repo)",
        allow_module_level=True,
    )

TIMEOUT = ("FAILED_EXEC_TIMEOUT", "FAILED_QUEUE_TIMEOUT")

# (spec, --set values, outcome, text the logs must hold)
ROWS: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("tutorials/hello_world.yaml", {}, "COMPLETED", "Hello from OSMO!"),
    (
        "tutorials/template_hello_world.yaml",
        {"workflow_name": "greetings", "message": "Custom message!"},
        "COMPLETED",
        "Custom message!",
    ),
    ("tutorials/token_example.yaml", {}, "COMPLETED", "Workflow ID: my-experiment-"),
    ("tutorials/parallel_tasks.yaml", {}, "COMPLETED", None),
    ("tutorials/serial_workflow.yaml", {}, "COMPLETED", "a line: Data from task 1"),
    ("tutorials/group_tasks.yaml", {}, "COMPLETED", None),
    # The tutorial's client calls nc once with no retry, racing the server's listen (on OSMO
    # too); its log must show the resolved address. parallel_workflow_v2 (which retries)
    # checks that bytes really cross between the tasks.
    ("tutorials/group_tasks_communication.yaml", {}, "COMPLETED", "Calling server at 127."),
    ("tutorials/combination_workflow_simple.yaml", {}, "COMPLETED", None),
    ("tutorials/combination_workflow_complex.yaml", {}, "COMPLETED", None),
    ("tutorials/resources_basic.yaml", {}, "COMPLETED", None),
    ("tests/serial_workflow.yaml", {}, "COMPLETED", "Data from task 2"),
    ("tests/parallel_workflow_v2.yaml", {}, "COMPLETED", "[client] hello"),
    ("tests/parallel_workflow_leader_exits.yaml", {}, "FAILED", None),
    ("tests/exit_actions.yaml", {}, "COMPLETED", "hello"),
    ("tests/exit_actions.yaml", {"code": 1}, "FAILED", None),
    ("tests/group_actions.yaml", {"ignore_nonlead_status": True}, "COMPLETED", None),
    ("tests/group_actions.yaml", {"ignore_nonlead_status": False}, "FAILED", None),
    ("tests/exec_timeout.yaml", {}, "TIMEOUT", None),
    ("scenarios/workflow_labels.yaml", {"exit_code": 0}, "COMPLETED", "workflow-labels scenario"),
    ("scenarios/workflow_labels.yaml", {"exit_code": 1}, "FAILED", None),
]


def _outcome(status: str) -> str:
    if status in TIMEOUT:
        return "TIMEOUT"
    return "FAILED" if status.startswith("FAILED") else status


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, list[str]]]:
    home = tmp_path_factory.mktemp("home")
    pool = default_local_pool()
    engine = Engine(Store(f"sqlite:///{home / 'db'}"), home, pools={"local": pool})
    stop = threading.Event()
    thread = threading.Thread(target=engine.run_forever, args=(stop,), daemon=True)
    thread.start()
    ids = []
    for path, values, _outcome, _text in ROWS:
        doc = spec.load(SPECS / path, set_values=values)
        sub = Submission(
            spec=doc.workflow,
            spec_text="",
            user="conformance",
            pool=pool,
            labels=dict(doc.workflow.labels),
        )
        ids.append(engine.submit(sub).id)
    for wid in ids:
        engine.wait(wid, timeout_s=400)
    yield engine, ids
    stop.set()
    thread.join(timeout=10)


def _logs(engine: Engine, wid: str) -> str:
    return "\n".join(
        p.read_text() for p in sorted((engine.home / "runs" / wid).glob("*/*/task.log"))
    )


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(ROWS)), ids=[f"{r[0]}{r[1] or ''}" for r in ROWS])
def test_row_reaches_its_outcome(finished: tuple[Engine, list[str]], index: int) -> None:
    engine, ids = finished
    path, _values, outcome, text = ROWS[index]
    record = engine.store.get_workflow(ids[index])
    assert _outcome(record.status) == outcome, _logs(engine, ids[index])[-3000:]
    if text is not None:
        assert text in _logs(engine, ids[index])


def test_labels_are_stored_and_filterable(finished: tuple[Engine, list[str]]) -> None:
    engine, ids = finished
    rows = engine.store.list_workflows(labels={"policy-yaml": "from-yaml"})
    assert sorted(r.id for r in rows) == sorted(ids[-2:])


def test_the_lead_ending_stops_the_sleeping_client(finished: tuple[Engine, list[str]]) -> None:
    engine, ids = finished
    index = next(i for i, row in enumerate(ROWS) if row[0] == "tests/parallel_workflow_v2.yaml")
    state = engine.state(ids[index])
    record_end = max(t.end_time_s or 0 for t in state.tasks.values())
    start = min(t.start_time_s or record_end for t in state.tasks.values())
    assert record_end - start < 60  # the client sleeps far longer unless stopped
    assert all(t.status.value == "COMPLETED" for t in state.tasks.values())
