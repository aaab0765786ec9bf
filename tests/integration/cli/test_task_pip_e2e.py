"""Issue 25: in a sandboxed task (trainyard's environment bound read-only), ``pip install``
and ``python -m pip install`` work and land in the task's own layer; a RESTART keeps what
was installed (the root is kept); ``trainyard``, ``osmo`` and ``torchrun`` stay on PATH."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from cli_e2e_support import Server

WHEELS = Path("/opt/pypi/simple/aenum")

SPEC = f"""\
workflow:
  name: pip-in-task
  pool: osmo
  tasks:
  - name: t
    image: ubuntu:24.04
    command: [bash, -c]
    args:
    - |
      set -e
      if [ "$TRAINYARD_RETRY_ID" = 0 ]; then
        pip install --no-index --find-links {WHEELS} aenum
        python -m pip install --no-index --find-links {WHEELS} aenum
        exit 7
      fi
      python -c 'import aenum; print("kept", aenum.__file__)'
      for p in trainyard osmo torchrun; do command -v $p >/dev/null && echo "has $p"; done
      osmo --help > /dev/null && echo "osmo runs"
    exitActions:
      RESTART: "7"
"""


def test_pip_install_in_a_sandboxed_task(server: Server, tmp_path: Path) -> None:
    if not WHEELS.is_dir():
        pytest.skip(f"no local package index at {WHEELS}")
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    workflow_id = server.submit(spec)
    data = server.wait(workflow_id, timeout_s=400)
    logs = server.logs(workflow_id)
    assert data["status"] == "COMPLETED", logs
    assert "Successfully installed aenum" in logs
    assert "Requirement already satisfied: aenum" in logs
    assert "kept /trainyard/venv/lib/" in logs
    assert "has trainyard" in logs and "has osmo" in logs and "has torchrun" in logs
    assert "osmo runs" in logs
    assert importlib.util.find_spec("aenum") is None  # trainyard's environment unchanged
