"""Issue 25 on Slurm: a task's credentials reach it as on the local backend (variables;
0600 files in the job's private folder), their values leave run.json when the runner starts
and the files are removed at the end: nothing of the home holds a value afterwards."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest
from slurm_cluster_support import EngineRunner

pytest_plugins = ["slurm_fixtures"]

pytestmark = pytest.mark.slow

SECRET = "slurmSecret_e5e5_value"
FILED = "slurmFile_c3c3_value"

SPEC = """\
workflow:
  name: slurm-creds
  tasks:
  - name: t
    image: ubuntu:24.04
    command: [bash, -c]
    args:
    - |
      echo "env $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-16)"
      echo "file $(sha256sum < /root/.gh/token | cut -c1-16)"
      echo "mode $(stat -c %a /root/.gh/token)"
    credentials:
      hf: {HF_TOKEN: token}
      gh: /root/.gh
"""


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def _grep(folder: Path, needle: str) -> list[str]:
    done = subprocess.run(["grep", "-rl", "--binary-files=text", needle, str(folder)],
                          capture_output=True, text=True, check=False)
    return done.stdout.split()


def test_slurm_task_gets_credentials_and_keeps_none(slurm_engine: EngineRunner,
                                                    tmp_path: Path) -> None:
    vault = slurm_engine.engine.credentials
    vault.set("tester", "hf", "GENERIC", {"token": SECRET})
    vault.set("tester", "gh", "GENERIC", {"token": FILED})
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    workflow_id = slurm_engine.submit_spec(spec)
    record = slurm_engine.wait(workflow_id, timeout_s=300)
    log = slurm_engine.log(workflow_id, "t")
    assert record.status == "COMPLETED", log
    assert f"env {_digest(SECRET)}" in log and f"file {_digest(FILED)}" in log, log
    assert "mode 600" in log
    assert _grep(slurm_engine.home, SECRET) == [] and _grep(slurm_engine.home, FILED) == []
