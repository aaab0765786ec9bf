"""Same spec, same model: OSMO's two-node torchrun example with one training
process per node (``--set n_gpus_per_node=1``), run from the CLI on the local pool and on the
Slurm test cluster's rehearsal pool (``scripts/slurm-cluster.sh``), ends with the same model,
every tensor ``torch.equal``, and byte-identical snapshots (one sha256); ``trainyard workflow
diff`` says so. The same spec with another ``--set batch_size`` on the local pool ends with
another model, and the diff says that too: the check can fail.

All three workflows run at once in one ``TRAINYARD_HOME`` (one server, both pools); only
``master_port`` differs between the two compared runs besides pool and backend, since two
gangs share this machine. The cluster is never stopped or restarted here.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from slurm_cluster_support import REPO, TRAINYARD, cli_env, register_pools, run_cli, why_no_cluster

EXAMPLE = REPO / "examples" / "torchrun_multinode" / "train.yaml"
SLURM_POOL = "slurm-rehearsal"  # GPU slots the cluster's CPU nodes run as processes
RUNS = {  # name -> (pool, --set values)
    "local": ("local", ["n_gpus_per_node=1", "master_port=29471"]),
    "slurm": (SLURM_POOL, ["n_gpus_per_node=1", "master_port=29472"]),
    "local_batch_64": ("local", ["n_gpus_per_node=1", "master_port=29473", "batch_size=64"]),
}
WAIT_S = 480  # all three together; ~75 s on a quiet 2-core machine, and within pytest's 600 s

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A TRAINYARD_HOME with the cluster's pools registered (``start`` on a running cluster
    only registers them); its server is stopped afterwards."""
    why = why_no_cluster()
    if why:
        pytest.skip(why)
    home = tmp_path_factory.mktemp("reproducible") / "home"
    register_pools(home)
    yield home
    run_cli(home, "server", "stop", timeout_s=120)


def _workflow_id(stdout: str) -> str:
    return stdout.split("Workflow submitted: ")[1].split()[0]


@pytest.fixture(scope="module")
def runs(home: Path) -> dict[str, str]:
    """Run the three workflows of ``RUNS`` at once, each to COMPLETED; name -> workflow id."""
    procs = {
        name: subprocess.Popen(
            [
                str(TRAINYARD),
                "workflow",
                "submit",
                str(EXAMPLE),
                "--pool",
                pool,
                "--wait",
                "--set",
                *sets,
            ],
            env=cli_env(home),
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for name, (pool, sets) in RUNS.items()
    }
    deadline = time.monotonic() + WAIT_S
    outputs = {}
    try:
        for name, proc in procs.items():
            outputs[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: {outputs[name][-3000:]}"
    return {name: _workflow_id(out) for name, out in outputs.items()}


def _snapshot(home: Path, workflow_id: str) -> Path:
    """The master's final snapshot (its first attempt's ``{{output}}/models``)."""
    path = home / "runs" / workflow_id / "master" / "0" / "output" / "models" / "snapshot.pth"
    assert path.is_file(), f"{path} missing"
    return path


def _model(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def _diff(home: Path, a: str, b: str) -> dict:
    answer = run_cli(home, "workflow", "diff", a, b, "-t", "json")
    assert answer.returncode == 0, answer.stderr
    return json.loads(answer.stdout)


def _differences(data: dict) -> dict[str, tuple[object, object]]:
    return {row["field"]: (row["a"], row["b"]) for row in data["differences"]}


def test_local_pool_and_slurm_train_the_same_model(home: Path, runs: dict[str, str]) -> None:
    local, slurm = _snapshot(home, runs["local"]), _snapshot(home, runs["slurm"])
    weights_local, weights_slurm = _model(local), _model(slurm)
    assert weights_local.keys() == weights_slurm.keys() and weights_local
    for name, tensor in weights_local.items():
        assert torch.equal(tensor, weights_slurm[name]), name
    digest = hashlib.sha256
    assert digest(local.read_bytes()).hexdigest() == digest(slurm.read_bytes()).hexdigest()
    record = torch.load(slurm, map_location="cpu", weights_only=True)["reproducibility"]
    assert (record["seed"], record["world_size"], record["deterministic"]) == (0, 2, False)
    data = _diff(home, runs["local"], runs["slurm"])
    assert data["models_identical"] is True, data["models"]
    assert _differences(data) == {
        "pool": ("local", SLURM_POOL),
        "backend": ("local", "slurm"),
        "set.master_port": (29471, 29472),
    }
    accuracy = [r for r in data["metrics"] if r["name"] == "final_val_accuracy"]
    assert accuracy and all(r["same"] for r in accuracy), accuracy


def test_another_batch_size_trains_another_model(home: Path, runs: dict[str, str]) -> None:
    first, other = (
        _model(_snapshot(home, runs["local"])),
        _model(_snapshot(home, runs["local_batch_64"])),
    )
    assert first.keys() == other.keys()
    assert not all(torch.equal(first[name], other[name]) for name in first)
    data = _diff(home, runs["local"], runs["local_batch_64"])
    assert data["models_identical"] is False
    assert _differences(data) == {"set.master_port": (29471, 29473), "set.batch_size": (32, 64)}
