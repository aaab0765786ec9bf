"""Each attempt has a private writable root (issue 11, "The root file system is read-only
except /tmp: touch /var/tmp/m fails"): writes anywhere under ``/`` succeed and land in the
attempt's own layer over a read-only view of the host; RESTART keeps that layer (the next
attempt in place sees the marker), RESCHEDULE starts from a fresh one; no host folder changes.

Through the real engine, the local backend and its bubblewrap sandbox (as root: overlayfs
layers; the private layer needs root, see docs/security.md).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.status import WorkflowStatus

SPEC = """
workflow:
  name: marker
  tasks:
  - name: t
    exitActions:
      {{action}}: 42
    environment:
      MARK: "{{mark}}"
    command:
    - sh
    - -c
    - |
      set -e
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        touch /var/tmp/$MARK
        mkdir /app && echo app > /app/$MARK
        mkdir -p /root/.local/lib && echo user-site > /root/.local/lib/$MARK
        echo local > /usr/local/$MARK
        echo conf >> /etc/$MARK
        exit 42
      fi
      {{check}} -e /var/tmp/$MARK
      {{check}} -e /app/$MARK
      {{check}} -e /root/.local/lib/$MARK
      {{check}} -e /usr/local/$MARK
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the private writable layer needs root (the runner mounts overlayfs)")
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home)
    yield made
    made.close()


HOST_PLACES = ("/var/tmp", "/usr/local", "/etc", "/app", "/root/.local/lib")


def _on_host(mark: str) -> list[str]:
    return [p for p in (os.path.join(f, mark) for f in HOST_PLACES) if os.path.lexists(p)]


@pytest.mark.parametrize(
    ("action", "check", "retries"),
    [
        ("RESTART", "test", 1),  # the same layer: every marker is still there
        ("RESCHEDULE", "test !", 1),  # a fresh layer: none is
    ],
)
def test_writes_under_root_are_private_and_kept_only_by_restart(
    run: EngineRun,
    action: str,
    check: str,
    retries: int,
) -> None:
    mark = f"trainyard-mark-{uuid.uuid4().hex}"
    try:
        wid = run.run(SPEC, action=action, check=check, mark=mark)
        state = run.engine.state(wid)
        logs = run.log(wid, "t", 0) + run.log(wid, "t", 1)
        assert state.status is WorkflowStatus.COMPLETED, logs
        assert state.tasks["t"].retry_id == retries
        assert _on_host(mark) == []
        first = run.engine.run_dir(wid, "t", 0)
        assert "Read-only file system" not in logs
        if action == "RESCHEDULE":  # the first attempt's layer is its own, left in its folder
            layers = first / "sandbox" / "overlay"
            assert [
                p.relative_to(layers).parts[-2:]
                for p in layers.rglob(mark)
                if p.parent.name == "tmp"
            ] == [("tmp", mark)]
    finally:
        for path in _on_host(mark):
            os.remove(path)
