"""The two-node torchrun example on the Slurm test cluster reaches the accuracy it reaches on
the local backend (2 nodes x 2 CPU processes, gloo, the same seeds), and the master's final
snapshot lands in the output dataset store as a new version, not only in its run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurm_cluster_support import REPO, EngineRunner

from trainyard.data.datasets import DatasetStore
from trainyard.data.transfer import file_digest, split_digest
from trainyard.pools import NodeSpec, Pool

pytest_plugins = ["slurm_fixtures"]

EXAMPLE = REPO / "examples" / "torchrun_multinode" / "train.yaml"
DATASET = "torchrun-multinode-model"  # the example's output_dataset
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not EXAMPLE.exists(), reason=f"{EXAMPLE} is not there yet"),
]


def rehearsal_pool(pool: Pool) -> Pool:
    """The test cluster's nodes declared as the example expects (GPU slots, 4 cores), with
    Slurm asked for memory only: the example's GPUs are CPU processes here."""
    return pool.model_copy(
        update={
            "name": f"{pool.name}-rehearsal",
            "strict": False,
            "nodes": [NodeSpec(name=n.name) for n in pool.nodes],
            "options": {**pool.options, "requests": ["memory"]},
        }
    )


def final_accuracy(runner: EngineRunner, workflow_id: str) -> float:
    metrics = (
        runner.engine.run_dir(workflow_id, "master", 0) / "output" / "models" / "metrics.jsonl"
    )
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    summary = next(r for r in records if r["event"] == "summary")
    assert summary["world_size"] == 4 and summary["nodes"] == 2
    return float(summary["final_val_accuracy"])


def _versions(store: DatasetStore) -> dict[int, dict[str, str]]:
    """Version number -> {file path: digest as the manifest records it (``blake3:HEX`` or a
    sha256's HEX)} of the example's dataset (empty if none)."""
    return {v.version: {f.path: f.digest for f in v.files} for v in store.versions(DATASET)}


def _same_file(digest: str | None, path: Path) -> bool:
    """Whether ``digest`` (a manifest's, blake3 or sha256) is the digest of ``path``."""
    if digest is None:
        return False
    algo, value = split_digest(digest)
    return value == file_digest(path, algo)


def test_torchrun_example_reaches_the_local_accuracy(
    slurm_engine: EngineRunner, local_engine: EngineRunner, slurm_pool: Pool, runner_home: Path
) -> None:
    store = DatasetStore(f"file://{runner_home / 'datasets'}")  # the task runners' store
    before = _versions(store)
    on_slurm = slurm_engine.submit_spec(
        EXAMPLE, ("master_port=29461",), pool=rehearsal_pool(slurm_pool)
    )
    on_local = local_engine.submit_spec(EXAMPLE, ("master_port=29462",))
    assert slurm_engine.wait(on_slurm, 600).status == "COMPLETED", slurm_engine.state(on_slurm)
    assert local_engine.wait(on_local, 600).status == "COMPLETED", local_engine.state(on_local)
    slurm_accuracy = final_accuracy(slurm_engine, on_slurm)
    assert slurm_accuracy >= 0.95
    assert slurm_accuracy == pytest.approx(final_accuracy(local_engine, on_local), abs=0.01)
    assert "Training completed successfully." in slurm_engine.log(on_slurm, "master")
    snapshot = (
        slurm_engine.engine.run_dir(on_slurm, "master", 0) / "output" / "models" / "snapshot.pth"
    )
    new = {n: files for n, files in _versions(store).items() if n not in before}
    assert len(new) == 2, new  # one upload per run, Slurm's and the local one
    assert any(_same_file(files.get("snapshot.pth"), snapshot) for files in new.values()), new
