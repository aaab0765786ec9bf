"""A workflow that waits behind another Slurm job says why, through the real CLI and a real
server on the real test cluster (issue 28): another job (not trainyard's) holds all of
``ty-node1``'s memory; the workflow's job, asked onto that node, stays PENDING for
``Resources``. ``workflow query``, ``query -t json`` and ``submit --wait`` say what it waits
for (Slurm's reason, in Slurm's word and plain words) and what it waits behind (the holding
job: id, name, user, nodes); once the holder ends, the workflow starts and completes.

The holder is held for as short as the test needs (it is cancelled once the reasons were
seen) and only on one node, so other tests' jobs can still run on ``ty-node2``. Skipped, with
the reason, when the cluster is not up (``slurm_fixtures``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainyard.pools import Pool

pytest_plugins = ["slurm_fixtures"]

pytestmark = [pytest.mark.timeout(600)]

SPEC = """
workflow:
  name: behind
  tasks:
  - name: t
    command: [echo, started-at-last]
"""


def _slurm(pool: Pool, *argv: str, check: bool = True) -> str:
    env = {**os.environ, "SLURM_CONF": str(pool.options["slurm_conf"])}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert not check or done.returncode == 0, done.stderr
    return done.stdout.strip()


TRAINYARD = Path(sys.executable).parent / "trainyard"


def _env(home: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(TRAINYARD_HOME=str(home), PATH=f"{TRAINYARD.parent}:{env.get('PATH', '')}")
    env["COLUMNS"] = "300"
    return env


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(TRAINYARD), *args], env=_env(home), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _query(home: Path, workflow_id: str) -> dict[str, Any]:
    return dict(json.loads(_cli(home, "workflow", "query", workflow_id, "-t", "json").stdout))


@pytest.fixture
def holder(slurm_pool: Pool) -> Iterator[str]:
    """A plain Slurm job (no trainyard) that holds all of ty-node1's memory until cancelled;
    its id, once it runs."""
    name = f"ty-hog-{uuid.uuid4().hex[:6]}"
    job = _slurm(
        slurm_pool,
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--partition={slurm_pool.options['partition']}",
        "--nodelist=ty-node1",
        "--mem=0",  # all the node's memory: nothing else fits there while it runs
        "--output=/dev/null",
        "--wrap=sleep 600",
    ).split(";")[0]
    try:
        deadline = time.monotonic() + 180
        while _slurm(slurm_pool, "squeue", "--noheader", f"--jobs={job}", "--format=%T") != (
            "RUNNING"
        ):
            assert time.monotonic() < deadline, "the holding job did not start in 180 s"
            time.sleep(0.5)
        yield job
    finally:
        _slurm(slurm_pool, "scancel", job, check=False)


@pytest.fixture
def home(slurm_pool: Pool, tmp_path: Path) -> Iterator[Path]:
    """The home of a real server (started by the CLI) whose one pool is the cluster's, its
    jobs asked onto ty-node1."""
    home = tmp_path / "home"
    home.mkdir()
    options = {
        **slurm_pool.options,
        "sbatch_args": ["--nodelist=ty-node1"],
        "status_interval_s": 0.5,
    }
    pool = slurm_pool.model_dump(mode="json", exclude={"name"}, exclude_none=True)
    (home / "pools.yaml").write_text(
        yaml.safe_dump({"pools": {"slurm-behind": {**pool, "options": options}}})
    )
    _cli(home, "workflow", "list", "-t", "json")
    yield home
    subprocess.run([str(TRAINYARD), "server", "stop"], env=_env(home), timeout=120, check=False)


def test_a_workflow_behind_another_job_says_why_and_starts_when_it_ends(
    home: Path, holder: str, slurm_pool: Pool, tmp_path: Path
) -> None:
    spec = tmp_path / "behind.yaml"
    spec.write_text(SPEC)
    waiting = subprocess.Popen(
        [str(TRAINYARD), "workflow", "submit", str(spec), "--pool", "slurm-behind", "--wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(home),
    )
    behind = f"behind Slurm job {holder} 'ty-hog-"
    try:
        deadline = time.monotonic() + 120
        while not (listed := json.loads(_cli(home, "workflow", "list", "-t", "json").stdout)):
            assert time.monotonic() < deadline and waiting.poll() is None, "no workflow"
            time.sleep(0.2)
        wid = listed[0]["id"]
        while True:
            data = _query(home, wid)
            reasons = [w["reason"] for w in data.get("waiting") or []]
            if any(behind in r for r in reasons):
                break
            assert time.monotonic() < deadline, data
            time.sleep(0.5)
        (reason,) = reasons
        task = data["groups"][0]["tasks"][0]
        assert task["status"] not in ("RUNNING", "COMPLETED"), data  # it has not started
        assert "is PENDING (Resources): it waits for resources" in reason, reason
        assert reason.endswith("on ty-node1"), reason
        shown = _cli(home, "workflow", "query", wid).stdout
        assert "Waiting: group t " in shown, shown
        assert behind in shown and "(Resources)" in shown, shown
    finally:
        _slurm(slurm_pool, "scancel", holder, check=False)  # the holder ends: it may start
    out, _ = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, out
    assert "group t " in out and behind in out and "(Resources)" in out, out
    assert "workflow COMPLETED" in out, out
    logs = _cli(home, "workflow", "logs", wid, "--no-follow").stdout
    assert "[t] started-at-last" in logs, logs
    assert _query(home, wid)["waiting"] == []
