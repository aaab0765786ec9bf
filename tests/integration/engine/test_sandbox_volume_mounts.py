"""``volumeMounts`` the pool allows are mounted (issue 11, "volumeMounts accepted by the pool's
allowed mounts are not mounted (ls /mnt/shared fails) and the workflow still COMPLETES"):
bound read-write at their place in the task's view; one whose host folder is missing fails
the task at start (FAILED_START_ERROR, exit code 3003) with a line saying which and why.

Through the real engine, the local backend and its bubblewrap sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import ExitCode, Status, WorkflowStatus

SPEC = """
workflow:
  name: mounts
  tasks:
  - name: t
    volumeMounts:
    - "{{source}}:/mnt/shared"
    command: [sh, -c, 'cat /mnt/shared/in.txt && echo from-task > /mnt/shared/out.txt']
"""


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    path = tmp_path / "shared data"
    path.mkdir()
    return path


@pytest.fixture
def run(tmp_path: Path, allowed: Path) -> Iterator[EngineRun]:
    require_bwrap()
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home, allowed_mounts=[str(allowed)])
    yield made
    made.close()


def test_an_allowed_mount_is_there_and_writable(run: EngineRun, allowed: Path) -> None:
    source = allowed / "team"
    source.mkdir()
    (source / "in.txt").write_text("from-host\n")
    wid = run.run(SPEC, source=str(source))
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, run.log(wid, "t")
    assert "[t] from-host" in run.log(wid, "t")
    assert (source / "out.txt").read_text() == "from-task\n"


def test_a_mount_that_cannot_be_made_fails_the_task_at_start(run: EngineRun, allowed: Path) -> None:
    missing = allowed / "not made"
    wid = run.run(SPEC, source=str(missing))
    task = run.engine.state(wid).tasks["t"]
    assert task.status is Status.FAILED_START_ERROR, run.log(wid, "t")
    assert task.exit_code == int(ExitCode.START_ERROR) == 3003
    assert f"volume mount {missing}:/mnt/shared: host folder {missing} does not exist" in (
        run.log(wid, "t")
    )
    assert "[t] " not in run.log(wid, "t")  # the command never ran
