"""A task cannot read the host's secrets (issue 11, seen after the sandbox was rebuilt: a
task's uid 0 is the host's uid 0 for file permissions, so a file of root's with mode
0600/0640 in a system folder, ``/etc/shadow``, ``/etc/munge/munge.key``, was readable), while
it still is root inside (``id -u`` is 0), writes under ``/`` stay private and its outputs are
uploaded. The task's uid 0 is the host's ``nobody`` (``linux.userns``); where that cannot be
(``sandbox.probe_remap``), the files are covered (``sandbox.secret_covers``: every file and
folder of ``/etc`` and the top of ``/var/lib`` that others may not read). The test plants
files of its own, in ``/etc`` and in ``/var/tmp`` (which the deny list does not cover), so
that it cannot pass vacuously.

Through the real engine, the local backend and its bubblewrap sandbox, as root.
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
  name: secrets
  tasks:
  - name: t
    environment:
      MARK: "{{mark}}"
    command:
    - sh
    - -c
    - |
      o="{{output}}"
      id -u > "$o/uid"
      for f in /etc/shadow /etc/gshadow /etc/munge/munge.key /etc/$MARK-secret \
          /var/tmp/$MARK-secret; do
        cat "$f" >> "$o/read" 2>/dev/null
      done
      echo private > /etc/$MARK && echo local > /usr/local/$MARK && echo ok > "$o/wrote"
    outputs:
    - url: "file://{{dest}}/"
"""


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the hole is uid 0 of the host: the test needs a server running as root")
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home, allowed_data_roots=[str(tmp_path / "dest")])  # the file:// output
    yield made
    made.close()


def test_a_task_reads_no_host_secret_but_is_root_writes_and_uploads(
    run: EngineRun,
    tmp_path: Path,
) -> None:
    mark = f"trainyard-secret-{uuid.uuid4().hex}"
    planted = Path(f"/etc/{mark}-secret")
    planted.write_text(f"{mark}-content\n")
    planted.chmod(0o600)
    elsewhere = Path(f"/var/tmp/{mark}-secret")
    elsewhere.write_text(f"{mark}-elsewhere\n")
    elsewhere.chmod(0o600)
    from trainyard.backends.local import sandbox

    scan = getattr(sandbox, "_scan_secrets", None)
    if scan is not None:
        scan.cache_clear()  # the engine's backend runs in this process: see the planted file
    # /etc/shadow and /etc/gshadow: a remapped task reads its own copies, scrubbed (below)
    secrets = {Path("/etc/munge/munge.key"): b"", planted: b"", elsewhere: b""}
    from trainyard.backends.local.sandbox import probe_remap

    if probe_remap() is not None:  # the deny list only: /var/tmp is not covered
        del secrets[elsewhere]
    for path in list(secrets):
        if path.exists():  # readable to root on the host: the check below is not vacuous
            secrets[path] = path.read_bytes()
            assert secrets[path].strip()
        else:
            del secrets[path]
    assert planted in secrets
    dest = tmp_path / "dest"
    try:
        wid = run.run(SPEC, mark=mark, dest=str(dest))
        log = run.log(wid, "t")
        assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
        read = (dest / "read").read_bytes() if (dest / "read").exists() else b""
        for path, content in secrets.items():
            assert content.strip() not in read, f"the task read {path}"
        for line in read.decode(errors="replace").splitlines():  # what shadow files it read
            assert line.count(":") >= 1 and line.split(":")[1] in ("*", "!"), line
        assert (dest / "uid").read_text().strip() == "0"
        assert (dest / "wrote").read_text() == "ok\n", log
        assert not os.path.lexists(f"/etc/{mark}") and not os.path.lexists(f"/usr/local/{mark}")
    finally:
        planted.unlink()
        elsewhere.unlink()
        for leftover in (f"/etc/{mark}", f"/usr/local/{mark}"):
            if os.path.lexists(leftover):
                os.remove(leftover)
