"""The runner follows no symlink the task made (issue 11, "The runner follows symlinks that
the task made: ``ln -s HOSTDIR /app; exit 42`` with ``exitActions: {RESTART: 42}`` and
``files: [{path: /app/x}]`` writes x on the host").

The seen case through the real engine, the local backend and its bubblewrap sandbox: the
restarted attempt refuses to write ``/app/x`` (the task fails with the runner's file-step
code 256 and says why), and the host folder stays empty.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import Status

SPEC = """
workflow:
  name: links
  tasks:
  - name: t
    exitActions:
      RESTART: 42
    files:
    - path: /app/x
      contents: "written by the runner"
    environment:
      HOST_DIR: "{{host_dir}}"
    command:
    - sh
    - -c
    - |
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then rm -rf /app; ln -s "$HOST_DIR" /app; exit 42; fi
      exit 0
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home)
    yield made
    made.close()


def test_a_restarted_task_cannot_make_the_runner_write_through_its_symlink(
    run: EngineRun, tmp_path: Path
) -> None:
    host_dir = tmp_path / "host folder"
    host_dir.mkdir()
    wid = run.run(SPEC, host_dir=str(host_dir))
    task = run.engine.state(wid).tasks["t"]
    assert list(host_dir.iterdir()) == []
    assert task.retry_id == 1  # the first attempt did make its link and asked for a RESTART
    assert task.status is Status.FAILED and task.exit_code == 256
    assert "cannot write /app/x" in run.log(wid, "t", 1)
    assert "symlink" in run.log(wid, "t", 1)
