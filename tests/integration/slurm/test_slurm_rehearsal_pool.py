"""``scripts/slurm-cluster.sh start`` registers the rehearsal pool ``slurm-rehearsal``, and
OSMO's two-node torchrun example (2 GPUs x 4 cores per task) runs on it from the CLI, on the
real test cluster, while ``slurm-local`` (real capacity: 0 GPUs, 2 cores) still refuses it.
The cluster is never stopped or restarted here: on a cluster already up,
``start`` only registers the pools, in a temporary ``TRAINYARD_HOME``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from slurm_cluster_support import REPO, register_pools, run_cli, why_no_cluster

EXAMPLE = REPO / "examples" / "torchrun_multinode" / "train.yaml"


def _cli(home: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return run_cli(home, *args, timeout_s=timeout_s)


def test_rehearsal_pool_runs_the_torchrun_example_from_the_cli(tmp_path: Path) -> None:
    why = why_no_cluster()
    if why:
        pytest.skip(why)
    home = tmp_path / "home"
    register_pools(home)
    pools = yaml.safe_load((home / "pools.yaml").read_text())["pools"]
    assert set(pools) == {"slurm-local", "slurm-rehearsal"}
    assert pools["slurm-rehearsal"]["options"]["requests"] == []
    assert {n["gpu"] for n in pools["slurm-rehearsal"]["nodes"]} == {8}
    try:
        refused = _cli(home, "workflow", "submit", str(EXAMPLE), "--pool", "slurm-local")
        assert refused.returncode == 2 and "asks for 2 GPUs" in refused.stderr, refused.stderr
        ran = _cli(
            home,
            "workflow",
            "submit",
            str(EXAMPLE),
            "--pool",
            "slurm-rehearsal",
            "--set",
            "n_epochs=1",
            "--wait",
        )
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert (
            "training/master RUNNING on ty-node1" in ran.stdout
            or "training/master RUNNING on ty-node2" in ran.stdout
        ), ran.stdout
        workflow_id = ran.stdout.split("Workflow submitted: ")[1].split()[0]
        log = _cli(home, "workflow", "logs", workflow_id, "--task", "master").stdout
        assert "--nproc_per_node 2" in log and "Epoch 1/1 completed" in log, log[-2000:]
        resources = _cli(home, "resource", "list", "--pool", "slurm-rehearsal")
        assert "virtual" in resources.stdout
    finally:
        _cli(home, "server", "stop", timeout_s=120)
