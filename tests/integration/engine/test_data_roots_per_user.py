"""The default data root is per user: a task of user ``tester`` (not the home's owner) can
neither read nor overwrite ``file://$TRAINYARD_HOME/storage/rootdata`` that the owner wrote,
and keeps its own data below ``storage/tester``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import ExitCode, Status

READ = """
workflow:
  name: reader
  tasks:
  - name: t
    inputs:
    - url: "file://{{home}}/storage/rootdata"
    command: [sh, -c, "cat {{input:0}}/secret.txt"]
"""

WRITE = """
workflow:
  name: writer
  tasks:
  - name: t
    outputs:
    - url: "file://{{home}}/storage/{{folder}}"
    command: [sh, -c, "echo overwritten > {{output}}/secret.txt"]
"""


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EngineRun]:
    require_bwrap()
    home = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(home))  # the submit check's home
    (home / "storage" / "rootdata").mkdir(parents=True)
    (home / "storage" / "rootdata" / "secret.txt").write_text("the owner's\n")
    made = EngineRun(home)
    yield made
    made.close()


def test_another_users_task_cannot_read_or_overwrite_the_owners_data(run: EngineRun) -> None:
    home = run.home
    read = run.run(READ, home=str(home))
    task = run.engine.state(read).tasks["t"]
    assert task.status is Status.FAILED and task.exit_code == ExitCode.DOWNLOAD_FAILED
    assert "the owner's" not in run.log(read, "t") and "data roots" in run.log(read, "t")
    wrote = run.run(WRITE, home=str(home), folder="rootdata")
    task = run.engine.state(wrote).tasks["t"]
    assert task.status is Status.FAILED and task.exit_code == ExitCode.UPLOAD_FAILED
    assert (home / "storage" / "rootdata" / "secret.txt").read_text() == "the owner's\n"
    own = run.run(WRITE, home=str(home), folder="tester/mine")
    assert run.engine.state(own).tasks["t"].status is Status.COMPLETED, run.log(own, "t")
    assert (home / "storage" / "tester" / "mine" / "secret.txt").read_text() == "overwritten\n"
