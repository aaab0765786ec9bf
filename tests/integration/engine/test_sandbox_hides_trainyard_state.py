"""A task sees nothing of trainyard's state (issue 11, "A task reads $TRAINYARD_HOME/tokens.json
... and cancels another user's workflow"): not the home's tokens.json, not the store, not
another workflow's run folder, not the host's /root, /home or /work; trainyard's own package
(the CLI inside tasks) is still importable, read-only.

Through the real engine, the local backend and its bubblewrap sandbox.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

import trainyard
from trainyard.status import WorkflowStatus

PACKAGE = Path(trainyard.__file__).parent

OTHER = """
workflow:
  name: other
  tasks:
  - name: secret
    command: [sh, -c, 'echo private > "{{output}}/data.txt"']
"""

PROBE = """
workflow:
  name: probe
  tasks:
  - name: look
    environment:
      HOME_DIR: "{{home}}"
      OTHER_RUN: "{{other_run}}"
      MARK: "{{mark}}"
    command:
    - sh
    - -c
    - |
      r="{{output}}/report"
      : > "$r"
      cat "$HOME_DIR/tokens.json" >/dev/null 2>&1 && echo "read tokens.json" >> "$r"
      test -e "$HOME_DIR/db.sqlite" && echo "sees the store" >> "$r"
      test -e "$OTHER_RUN" && echo "sees another run" >> "$r"
      test -e "$HOME_DIR/local" && echo "sees the backend folder" >> "$r"
      for folder in /root /home /work; do
        test -e "$folder/$MARK-host" && echo "sees $folder/$MARK-host" >> "$r"
      done
      for folder in /root /home /work; do echo x > "$folder/$MARK" 2>/dev/null; done
      python -c 'import trainyard' || echo "no trainyard package" >> "$r"
      touch "$(python -c 'import trainyard, os; print(os.path.dirname(trainyard.__file__))')/$MARK" \
        2>/dev/null && echo "wrote into trainyard's package" >> "$r"
      echo finished >> "$r"
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    home = tmp_path / "home dir"
    home.mkdir()
    (home / "tokens.json").write_text('{"admin-token-XYZ": {"user": "admin"}}')
    made = EngineRun(home)
    yield made
    made.close()


def test_a_task_sees_no_tokens_store_other_runs_or_host_homes(run: EngineRun) -> None:
    other = run.run(OTHER)
    assert run.engine.state(other).status is WorkflowStatus.COMPLETED
    other_run = run.engine.run_dir(other, "secret", 0)
    assert (other_run / "output" / "data.txt").exists()
    mark = f"trainyard-probe-{uuid.uuid4().hex}"
    folders = [Path(f) for f in ("/root", "/home", "/work") if Path(f).is_dir()]
    written = [folder / mark for folder in folders]
    planted = [folder / f"{mark}-host" for folder in folders]
    try:
        for path in planted:
            path.write_text("the host's own file")
        wid = run.run(PROBE, home=str(run.home), other_run=str(other_run), mark=mark)
        assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, run.log(wid, "look")
        report = run.output(wid, "look", "report").splitlines()
        assert report == ["finished"], report
        assert [p for p in written if p.exists()] == []
        assert not (PACKAGE / mark).exists()
    finally:
        for path in [*written, *planted, PACKAGE / mark]:
            path.unlink(missing_ok=True)
