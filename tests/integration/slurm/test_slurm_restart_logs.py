"""On the Slurm test cluster: a RESTART exit action re-runs the task with its files kept
(sandbox and ``{{output}}``), and ``workflow logs`` (the server's ``WorkflowLogs.read``, what the
CLI prints) returns every attempt's lines in OSMO's line format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from slurm_cluster_support import EngineRunner

from trainyard.server.auth import User
from trainyard.server.service import Service
from trainyard.status import Status

pytest_plugins = ["slurm_fixtures"]

pytestmark = pytest.mark.slow

OSMO_LINE = re.compile(  # the runner's own lines carry [trainyard] after the task's tag
    r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(?P<task>[^\]]+)\](\[trainyard\])? (?P<text>.*)$"
)
SPEC = """workflow:
  name: restart-keeps-files
  tasks:
  - name: again
    command: [sh, -c]
    args:
    - |
      if [ -f {{output}}/first.txt ]; then
        echo "found output: $(cat {{output}}/first.txt)"
        echo "found tmp: $(cat /tmp/kept.txt)"
        echo second > {{output}}/second.txt
        exit 0
      fi
      echo "from attempt one" > {{output}}/first.txt
      echo "tmp of attempt one" > /tmp/kept.txt
      echo "first attempt asks for a restart"
      exit 42
    exitActions:
      RESTART: 42
"""


@pytest.fixture(scope="module")
def restarted(slurm_engine: EngineRunner, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The workflow id of SPEC, run to its end on the Slurm pool."""
    path = tmp_path_factory.mktemp("restart") / "restart.yaml"
    path.write_text(SPEC)
    workflow_id = slurm_engine.submit_spec(path)
    assert slurm_engine.wait(workflow_id, 180).status == "COMPLETED", slurm_engine.state(
        workflow_id
    )
    return workflow_id


def test_restart_keeps_the_output_and_sandbox_of_the_failed_attempt(
    slurm_engine: EngineRunner, restarted: str
) -> None:
    task = slurm_engine.state(restarted).tasks["again"]
    assert (task.status, task.retry_id) == (Status.COMPLETED, 1)
    log = slurm_engine.log(restarted, "again")
    assert "found output: from attempt one" in log
    assert "found tmp: tmp of attempt one" in log
    output = slurm_engine.engine.run_dir(restarted, "again", 1) / "output"
    assert sorted(p.name for p in output.iterdir()) == ["first.txt", "second.txt"]


def test_workflow_logs_return_every_attempt_in_osmo_format(
    slurm_engine: EngineRunner, restarted: str
) -> None:
    service = Service(slurm_engine.engine)
    lines = list(service.logs.read(restarted, User("admin", admin=True)))
    assert lines, "no log lines"
    matches = [OSMO_LINE.match(line.text) for line in lines]
    assert all(matches), [line.text for line, m in zip(lines, matches, strict=False) if not m]
    assert all(
        m["task"] == line.task == "again" for line, m in zip(lines, matches, strict=False) if m
    )
    by_attempt = {r: [line.text for line in lines if line.retry_id == r] for r in (0, 1)}
    assert any(t.endswith("[again] first attempt asks for a restart") for t in by_attempt[0])
    assert any(t.endswith("[again] found output: from attempt one") for t in by_attempt[1])
    last = list(
        service.logs.read(
            restarted, User("admin", admin=True), task="again", retry_id=1, last_lines=2
        )
    )
    assert len(last) == 2 and all(line.retry_id == 1 for line in last)


def test_logs_of_a_two_node_group_hold_both_tasks(
    slurm_engine: EngineRunner, tmp_path: Path
) -> None:
    path = tmp_path / "pair.yaml"  # the lead outlives the other task: its ending stops it
    path.write_text("""workflow:
  name: log-pair
  groups:
  - name: pair
    tasks:
    - {name: lead, lead: true, command: [sh, -c, "echo lead on $SLURMD_NODENAME; sleep 5"]}
    - {name: other, command: [sh, -c, "echo other on $SLURMD_NODENAME"]}
""")
    workflow_id = slurm_engine.submit_spec(path)
    assert slurm_engine.wait(workflow_id, 120).status == "COMPLETED", slurm_engine.state(
        workflow_id
    )
    texts = [
        line.text
        for line in Service(slurm_engine.engine).logs.read(workflow_id, User("admin", admin=True))
    ]
    assert any(re.search(r" \[lead\] lead on ty-node\d$", t) for t in texts), texts
    assert any(re.search(r" \[other\] other on ty-node\d$", t) for t in texts), texts
    assert texts == sorted(texts, key=lambda t: t[:19])  # merged by time
