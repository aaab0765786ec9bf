"""A task may change existing files of the host's root in its private ``/usr`` and dpkg's
state in place (issue 11: ``echo x >> /usr/share/...`` and ``apt install`` failed, because
the task's uid 0 is the host's ``nobody`` and the overlay's lower layer belongs to the host's
root), while the host's files stay unchanged and its secrets unreadable: ``/usr`` and
``/var/lib/dpkg`` have an idmapped lower layer (the host's root files are the task's root's
there, ``sandbox.IDMAPPED``), a file of root's that others may not read below them is covered
(``sandbox.idmapped_covers``), and ``/etc`` is not idmapped (a planted 0600 file there stays
unreadable; an existing root file of ``/etc`` is still not the task's; ``/etc/shadow`` is the
task's own copy with every password field scrubbed, ``sandbox.account_entries``).

The test plants its own files in the host's ``/usr/share`` (a 0644 one to append to, a 0600
one that must stay unreadable) and ``/etc`` so that it cannot pass vacuously. Through the
real engine, the local backend and its bubblewrap sandbox, as root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from isolation_support import EngineRun, require_bwrap

from trainyard.backends.local import hostscan, sandbox
from trainyard.status import WorkflowStatus

SPEC = """
workflow:
  name: system-edits
  tasks:
  - name: t
    environment:
      MARK: "{{mark}}"
    command:
    - sh
    - -c
    - |
      o="{{output}}"
      echo appended >> /usr/share/$MARK-open && tail -n 1 /usr/share/$MARK-open > "$o/usr"
      printf '\\n' >> /var/lib/dpkg/status && echo ok > "$o/dpkg"
      mkdir /usr/share/$MARK-dir && echo ok > "$o/usr-mkdir"
      cat /usr/share/$MARK-secret /etc/$MARK-secret >> "$o/read" 2>/dev/null
      cut -d: -f2 /etc/shadow | sort -u > "$o/shadow-fields"
      echo more >> /etc/$MARK-open 2>/dev/null && echo appended > "$o/etc"
      id -u > "$o/uid"
      exit 0
"""


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def run(tmp_path: Path) -> Iterator[EngineRun]:
    require_bwrap()
    if os.geteuid() != 0:
        pytest.skip("the private layers and the uid remap need a server running as root")
    if sandbox.probe_remap() is not None:
        pytest.skip(f"no uid remap here: {sandbox.probe_remap()}")
    home = tmp_path / "home dir"
    home.mkdir()
    made = EngineRun(home)
    yield made
    made.close()


def test_a_task_edits_usr_and_dpkg_state_in_place_but_reads_no_secret(run: EngineRun) -> None:
    mark = f"trainyard-edit-{uuid.uuid4().hex[:12]}"
    secret = f"root-only-{uuid.uuid4().hex}"
    planted = {
        Path(f"/usr/share/{mark}-open"): ("original\n", 0o644),
        Path(f"/usr/share/{mark}-secret"): (secret + "\n", 0o600),
        Path(f"/etc/{mark}-secret"): (secret + "\n", 0o600),
        Path(f"/etc/{mark}-open"): ("original\n", 0o644),
    }
    status = Path("/var/lib/dpkg/status")
    status_before = _digest(status) if status.exists() else None
    try:
        for path, (text, mode) in planted.items():
            path.write_text(text)
            path.chmod(mode)
        hostscan._scan_root_only.cache_clear()  # the deny list is looked at once per process
        wid = run.run(SPEC, mark=mark)
        log = run.log(wid, "t")
        assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
        output = run.engine.run_dir(wid, "t", 0) / "output"
        assert (output / "uid").read_text().strip() == "0", log
        assert (output / "usr").read_text() == "appended\n", log  # edited in place
        assert (output / "usr-mkdir").read_text() == "ok\n", log
        if status_before is not None:
            assert (output / "dpkg").read_text() == "ok\n", log
            assert _digest(status) == status_before  # the host's dpkg state is unchanged
        read = (output / "read").read_text() if (output / "read").exists() else ""
        assert secret not in read, log
        # /etc/shadow is the task's own copy, every password field scrubbed (account_entries)
        fields = (output / "shadow-fields").read_text().split()
        assert fields and set(fields) <= {"*", "!"}, log
        assert not (output / "etc").exists(), log  # /etc is not idmapped
        for path, (text, mode) in planted.items():
            assert path.read_text() == text and (path.stat().st_mode & 0o777) == mode, path
        assert not Path(f"/usr/share/{mark}-dir").exists()
    finally:
        for path in planted:
            path.unlink(missing_ok=True)
        hostscan._scan_root_only.cache_clear()


DPKG = """
workflow:
  name: dpkg-install
  tasks:
  - name: t
    environment:
      PKG: "{{pkg}}"
    command:
    - sh
    - -c
    - |
      set -e
      mkdir -p /tmp/p/DEBIAN /tmp/p/usr/share/$PKG
      printf 'Package: %s\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: t\\n' "$PKG" > /tmp/p/DEBIAN/control
      echo installed > /tmp/p/usr/share/$PKG/file
      dpkg-deb --build /tmp/p /tmp/p.deb
      dpkg -i /tmp/p.deb
      dpkg -s "$PKG" | grep '^Status:' > "{{output}}/status"
      cat /usr/share/$PKG/file > "{{output}}/file"
"""


def test_dpkg_installs_a_package_into_the_private_root_only(run: EngineRun) -> None:
    """``dpkg -i`` inside (dpkg needs its database folder writable and changes its files
    in place); the host knows nothing of the package afterwards."""
    if shutil.which("dpkg") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg is not installed (not a Debian host)")
    pkg = f"trainyard-test-{uuid.uuid4().hex[:10]}"
    status = Path("/var/lib/dpkg/status")
    before = _digest(status)
    wid = run.run(DPKG, pkg=pkg)
    log = run.log(wid, "t")
    assert run.engine.state(wid).status is WorkflowStatus.COMPLETED, log
    output = run.engine.run_dir(wid, "t", 0) / "output"
    assert (output / "status").read_text() == "Status: install ok installed\n", log
    assert (output / "file").read_text() == "installed\n", log
    assert _digest(status) == before and not Path(f"/usr/share/{pkg}").exists()
    host = subprocess.run(["dpkg", "-s", pkg], capture_output=True, text=True, check=False)
    assert host.returncode != 0, host.stdout
