"""The Slurm backend hands each task the server URL and a task token of its own workflow
(never the caller's token), in a run.json only its owner can read, and ``--dry-run`` shows
no token (issue 11)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from slurm_support import FakeSlurm, launches

from trainyard import tasktokens
from trainyard.backends.base import TaskResources
from trainyard.backends.slurm import SlurmBackend
from trainyard.pools import NodeSpec, Pool

POOL = Pool(
    name="slurm-pool",
    backend="slurm",
    nodes=[NodeSpec(name="n1"), NodeSpec(name="n2")],
    options={"partition": "batch"},
)
TWO = {"master": TaskResources(cpu=1), "worker": TaskResources(cpu=1)}


def test_tasks_get_a_task_token_in_a_private_run_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_SERVER_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TRAINYARD_TOKEN", "the-admins-own-token")
    backend = SlurmBackend(POOL, tmp_path, commands=FakeSlurm(), python="/usr/bin/python3")
    group = launches(tmp_path, TWO)
    shown = backend.dry_run(group)
    backend.start_group(group)
    for launch in group:
        path = launch.run_dir / "run.json"
        env = json.loads(path.read_text())["sandbox"]["env"]
        token = env["TRAINYARD_TOKEN"]
        assert env["TRAINYARD_SERVER_URL"] == "http://127.0.0.1:9"
        assert tasktokens.token_workflow(tmp_path, token) == launch.key.workflow_id
        assert token != "the-admins-own-token" and token not in shown
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "tyt1." not in shown and "the-admins-own-token" not in shown
