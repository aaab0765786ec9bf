"""The spec's ``environment:`` reaches the task only, never a host-side program.

The attack seen: ``PATH: "{{output}}:/usr/bin:/bin"`` plus a RESTART: the first attempt
writes ``nsenter`` and ``bwrap`` into its output folder (a host folder bound into the
sandbox, which RESTART keeps), and the second attempt's runner (a forked one: the task has
an output to upload) started ``nsenter ... bwrap`` by name with the task's PATH: the task's
``nsenter`` ran as the host's root. Here the fakes would leave a mark in a host folder the sandbox
does not show; none may appear, and the task still gets the PATH it asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import Status

SPEC = """
workflow:
  name: hostenv
  tasks:
  - name: t
    exitActions:
      RESTART: 42
    outputs:  # data to move: a forked runner, whose sandbox prefix starts with nsenter
    - dataset:
        name: hostenv-out
    environment:
      PATH: "{{output}}:/usr/bin:/bin"
      HOST_MARKS: "{{marks}}"
      GCONV_PATH: "{{output}}"
    command: [sh, -c]
    args:
    - |
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        for p in nsenter bwrap env podman pasta unshare; do
          printf '#!/bin/sh\\ntouch "%s/%s"\\nexit 1\\n' "$HOST_MARKS" "$p" > {{output}}/$p
          chmod 755 {{output}}/$p
        done
        exit 42
      fi
      echo "path=$PATH gconv=$GCONV_PATH"
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    home = tmp_path / "home"
    home.mkdir()
    made = EngineRun(home)
    yield made
    made.close()


def test_a_spec_path_never_picks_the_host_programs_of_the_sandbox(
    run: EngineRun, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir(mode=0o777)
    wid = run.run(SPEC, marks=str(marks))
    task = run.engine.state(wid).tasks["t"]
    assert sorted(p.name for p in marks.iterdir()) == []  # no fake ran on the host
    assert task.retry_id == 1 and task.status is Status.COMPLETED, run.log(wid, "t", 1)
    line = next(l for l in run.log(wid, "t", 1).splitlines() if "path=" in l)
    assert line.split("path=")[1].split(" ")[0].endswith(":/usr/bin:/bin")
    assert "gconv=/" in line  # the task's own variables are all there, inside
