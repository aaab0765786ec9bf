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
    done = subprocess.run(
        ["grep", "-rl", "--binary-files=text", needle, str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.split()


def test_slurm_task_gets_credentials_and_keeps_none(
    slurm_engine: EngineRunner, tmp_path: Path
) -> None:
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


PENDING = "slurmPending_4b4b_value"


def test_a_job_cancelled_while_pending_leaves_no_credential_value_in_run_json(
    slurm_pool, tmp_path: Path
) -> None:
    """Issue 25: the runner takes the values out of run.json when it starts; a job
    cancelled before it starts (held here by ``--begin=now+1hour``) never runs it, and the
    run folder is kept: the backend takes them out at the cancel."""
    import time

    from trainyard.pools import Pool

    held = slurm_pool.model_copy(
        update={
            "name": "slurm-held",
            "options": {
                **slurm_pool.options,
                "sbatch_args": [*slurm_pool.options.get("sbatch_args", []), "--begin=now+1hour"],
            },
        }
    )
    assert isinstance(held, Pool)
    (tmp_path / "home").mkdir()
    runner = EngineRunner(tmp_path / "home", held)
    try:
        runner.engine.credentials.set("tester", "hf", "GENERIC", {"token": PENDING})
        runner.engine.credentials.set("tester", "gh", "GENERIC", {"token": PENDING + "2"})
        spec = tmp_path / "spec.yaml"
        spec.write_text(SPEC)
        workflow_id = runner.submit_spec(spec)
        deadline = time.monotonic() + 120
        while not _grep(runner.home, PENDING) and time.monotonic() < deadline:
            time.sleep(0.2)  # until the attempt's run.json is written (sbatch sent)
        assert _grep(runner.home, PENDING), "the pending attempt's run.json never held it"
        runner.engine.cancel(workflow_id)
        record = runner.wait(workflow_id, timeout_s=120)
        assert record.status == "FAILED_CANCELED"
        assert _grep(runner.home, PENDING) == []
    finally:
        runner.close()
