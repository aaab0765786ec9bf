"""``inputs: - task: WORKFLOW_ID:TASK`` through the real engine and the local backend.

Workflow A's task writes a file to ``{{output}}``; workflow B, submitted after A finished,
reads it through ``task: A_ID:make``. B's task fails with OSMO's download-failure exit code
(2010) and a log line naming the workflow, the task and why, when that task did not
COMPLETE or does not exist.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_run import EngineRun

from trainyard.status import ExitCode, Status, WorkflowStatus

PRODUCER = """
workflow:
  name: producer
  tasks:
  - name: make
    command: [sh, -c, 'echo {{greeting}} > "{{output}}/greeting.txt"; exit {{code}}']
default-values:
  greeting: hello-from-A
  code: 0
"""

CONSUMER = """
workflow:
  name: consumer
  tasks:
  - name: read
    command: [sh, -c, 'test "$(cat "{{input:0}}/greeting.txt")" = hello-from-A']
    inputs:
    - task: "{{upstream}}:make"
"""


@pytest.fixture
def run(tmp_path: Path, store_url: str) -> Iterator[EngineRun]:
    """The engine on the default local pool, its own sandbox setting (not forced to bwrap)."""
    home = tmp_path / "home dir"  # a space in every path
    home.mkdir()
    made = EngineRun(home, store_url, sandbox="auto")  # the default pool's own choice
    yield made
    made.close()


def test_another_workflows_completed_output_is_read(run: EngineRun) -> None:
    producer = run.run(PRODUCER)
    assert run.engine.state(producer).status is WorkflowStatus.COMPLETED
    consumer = run.run(CONSUMER, upstream=producer)
    state = run.engine.state(consumer)
    assert state.status is WorkflowStatus.COMPLETED, run.log(consumer, "read")
    assert state.tasks["read"].exit_code == 0
    copied = run.engine.run_dir(consumer, "read", 0) / "input" / "0" / "greeting.txt"
    assert copied.read_text().strip() == "hello-from-A"


def test_an_unknown_workflow_fails_the_task_with_2010(run: EngineRun) -> None:
    consumer = run.run(CONSUMER, upstream="nobody-7")
    task = run.engine.state(consumer).tasks["read"]
    assert task.status is Status.FAILED
    assert task.exit_code == int(ExitCode.DOWNLOAD_FAILED) == 2010
    assert "input 0 (task nobody-7:make): no workflow nobody-7" in run.log(consumer, "read")


def test_a_task_that_did_not_complete_fails_the_task_with_2010(run: EngineRun) -> None:
    producer = run.run(PRODUCER, code=3)  # writes its output, then fails
    assert run.engine.state(producer).tasks["make"].status is Status.FAILED
    consumer = run.run(CONSUMER, upstream=producer)
    task = run.engine.state(consumer).tasks["read"]
    assert task.exit_code == 2010
    log = run.log(consumer, "read")
    assert f"task make of workflow {producer} is FAILED, not COMPLETED" in log
    assert not (run.engine.run_dir(consumer, "read", 0) / "input" / "0" / "greeting.txt").exists()
