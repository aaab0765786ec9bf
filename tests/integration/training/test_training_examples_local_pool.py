"""The multinode, heterogeneous and pytorch_dist examples through the real engine on the local
pool (every task a sandboxed task runner started by the local backend, statuses decided by the
engine, the lead's output uploaded by its runner into the dataset store under
``$TRAINYARD_HOME``), and ``scripts/demo.sh`` checked against the spec it submits.

The multinode test submits exactly what ``make demo`` submits (spec and ``--set`` values read
from scripts/demo.sh: 2 nodes x 2 processes, 10 epochs) and checks the accuracy the demo
promises (0.95 on the digits). The digits MLP trains in about a second; each run's time is
mostly interpreter and torchrun start-up (about 10-15 s on a 2-core machine).
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from training_integration_support import (
    BIN,
    EXAMPLES,
    EngineRun,
    free_port,
    metrics,
    runner,  # noqa: F401 (a fixture)
)

from trainyard.data.datasets import DatasetStore
from trainyard.data.transfer import file_digest, plan_uploads, split_digest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = EXAMPLES.parent
MULTINODE = EXAMPLES / "torchrun_multinode" / "train.yaml"
HETEROGENEOUS = EXAMPLES / "heterogeneous" / "train.yaml"
PYTORCH_DIST = EXAMPLES / "pytorch_dist" / "train.yaml"
DEMO = REPO / "scripts" / "demo.sh"

EPOCH_LINES = re.compile(
    r"Epoch (\d+)/(\d+) completed in [\d.]+ seconds\n"
    r"Validation Loss: ([\d.]+), Validation Accuracy: ([\d.]+)\n"
    r"Epoch Throughput: [\d.]+ images/second\n"
)
LOG_PREFIX = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[[^\]]+\] ?", re.M)


def _store(runner: EngineRun) -> DatasetStore:
    return DatasetStore(f"file://{runner.home / 'datasets'}")


def _statuses(runner: EngineRun, workflow_id: str) -> dict[str, tuple[str, int | None, int]]:
    tasks = runner.state(workflow_id).tasks
    return {name: (t.status.value, t.exit_code, t.retry_id) for name, t in tasks.items()}


def _command_output(log: str) -> str:
    """The task log without each line's ``DATE TIME [task] `` prefix."""
    return LOG_PREFIX.sub("", log)


def _epochs_in_log(log: str) -> list[tuple[int, int, float]]:
    """(epoch, total, validation accuracy) of each three-line epoch report, in order."""
    return [(int(m[1]), int(m[2]), float(m[4])) for m in EPOCH_LINES.finditer(_command_output(log))]


def _summary_block(log: str) -> str:
    found = re.search(
        r"\n\nTraining Summary:\n(.*?Training completed successfully\.)", _command_output(log), re.S
    )
    assert found, log[-3000:]
    return found.group(1)


# ---------------------------------------------------------------- torchrun_multinode


def _demo_submission() -> tuple[list[str], Path, dict[str, Any]]:
    """scripts/demo.sh's one ``$ty workflow submit`` line: its arguments, and the spec and
    ``--set`` values they name."""
    text = DEMO.read_text()
    submits = [shlex.split(m) for m in re.findall(r"^\$ty workflow submit (.*)$", text, re.M)]
    assert len(submits) == 1, submits
    args = submits[0]
    values: dict[str, Any] = {}
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--set":
            key, _, raw = value.partition("=")
            values[key] = yaml.safe_load(raw)
    return args, REPO / args[0], values


def test_multinode_example_as_the_demo_submits_it_reaches_095_and_stores_the_snapshot(
    runner: EngineRun, tmp_path: Path
) -> None:
    """The spec and --set values of scripts/demo.sh (OSMO's two-node tutorial, 2 nodes x 2
    processes, the default 10 epochs): per-epoch lines and the Training Summary in the lead's
    log, the same figures in metrics.jsonl, and the lead's models folder stored as version 2
    of torchrun-multinode-model (version 1 was there before)."""
    _args, spec, values = _demo_submission()
    assert spec == MULTINODE and values == {"n_gpus_per_node": 2}, values
    epochs = 10
    dataset = "torchrun-multinode-model"
    defaults = yaml.safe_load(MULTINODE.read_text().split("default-values:")[1])
    assert (defaults["n_epochs"], defaults["output_dataset"]) == (epochs, dataset), defaults

    older = tmp_path / "older"
    older.mkdir()
    (older / "note.txt").write_text("a model from before\n")
    assert _store(runner).upload(dataset, plan_uploads([f"{older}/"], None)).version == 1

    # a free port, not the default 29400, in case the pool falls back to the host's loopback
    wid = runner.submit(MULTINODE, {**values, "master_port": free_port()})
    assert runner.wait(wid) == "COMPLETED", runner.logs(wid)
    statuses = _statuses(runner, wid)
    assert statuses["master"] == ("COMPLETED", 0, 0), statuses
    # the worker ends by itself (0) or is stopped once the lead has ended (no code of its own)
    assert statuses["worker"][0::2] == ("COMPLETED", 0) and statuses["worker"][1] in (0, None), (
        statuses
    )

    # global rank 0 (on the master) prints each epoch's three lines, as the Slurm seed does
    log = runner.log(wid, "master")
    reported = _epochs_in_log(log)
    assert [(e, t) for e, t, _ in reported] == [(e, epochs) for e in range(1, epochs + 1)], log[
        -3000:
    ]
    summary_text = _summary_block(log)
    assert re.search(r"^Total training time: [\d.]+ seconds$", summary_text, re.M), summary_text
    assert re.search(r"^Throughput: [\d.]+ images/second$", summary_text, re.M), summary_text
    assert (
        "Number of nodes: 2\nNumber of processes per node: 2\nTotal processes used: 4\n"
        "Training completed successfully."
    ) in summary_text
    assert "Epoch 1/" not in runner.log(wid, "worker"), "only global rank 0 reports"

    # the same figures as JSON lines in the lead's {{output}}/models
    output = runner.run_dir(wid, "master") / "output" / "models"
    records = metrics(output)
    start = records[0]
    assert start["event"] == "start" and start["world_size"] == 4 and start["nodes"] == 2, start
    assert (
        start["backend"] == "gloo" and start["dataset"] == "digits" and start["first_epoch"] == 1
    ), start
    assert start["epochs_completed"] == 0 and start["resumed_from"] is None, start
    epoch_records = [r for r in records if r["event"] == "epoch"]
    assert [r["epoch"] for r in epoch_records] == list(range(1, epochs + 1))
    assert [round(r["val_accuracy"], 4) for r in epoch_records] == [a for _, _, a in reported]
    summary = records[-1]
    assert summary["event"] == "summary", records[-3:]
    assert (summary["nodes"], summary["world_size"], summary["last_epoch"]) == (2, 4, epochs), (
        summary
    )
    assert summary["final_val_accuracy"] >= 0.95, summary
    assert summary["final_val_accuracy"] == epoch_records[-1]["val_accuracy"]

    snapshot = output / "snapshot.pth"
    assert torch.load(snapshot, weights_only=True)["epochs_completed"] == epochs

    # the final snapshot stored as a new version of the output dataset, byte for byte
    info = _store(runner).info(dataset)
    assert [v.version for v in info.versions] == [1, 2] and info.tags["latest"] == 2
    files = {f.path: f for f in info.versions[1].files}
    assert set(files) == {"snapshot.pth", "metrics.jsonl"}, files
    algo, value = split_digest(files["snapshot.pth"].digest)  # blake3 or sha256
    assert value == file_digest(snapshot, algo)
    assert files["snapshot.pth"].size == snapshot.stat().st_size
    fetched = tmp_path / "fetched"
    _store(runner).download(f"{dataset}:latest", fetched)
    assert torch.load(fetched / "snapshot.pth", weights_only=True)["epochs_completed"] == epochs


def test_demo_script_submits_the_two_by_two_multinode_spec(tmp_path: Path) -> None:
    """``make demo`` runs scripts/demo.sh, which submits examples/torchrun_multinode with
    2 nodes x 2 processes (its defaults, 10 epochs) and then shows the dataset the lead's
    output became. The submit line is rendered here with trainyard's own CLI (``workflow
    spec``: render + validate, nothing runs); the multinode test above runs that spec."""
    assert "bash scripts/demo.sh" in (REPO / "Makefile").read_text()
    text = DEMO.read_text()
    assert subprocess.run(["bash", "-n", str(DEMO)], capture_output=True).returncode == 0
    assert re.search(r"^ty=\.venv/bin/trainyard$", text, re.M), "the venv make builds"

    args, _spec, _values = _demo_submission()
    assert args[0] == "examples/torchrun_multinode/train.yaml"
    assert "--wait" in args and "--logs" in args  # live progress and the per-epoch lines
    spec_args = [a for a in args if a not in ("--wait", "--logs")]

    done = subprocess.run(
        [str(BIN / "trainyard"), "workflow", "spec", *spec_args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "TRAINYARD_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 0, done.stderr
    rendered: dict[str, Any] = yaml.safe_load(done.stdout)
    (group,) = rendered["workflow"]["groups"]
    tasks = {t["name"]: t for t in group["tasks"]}
    assert list(tasks) == ["master", "worker"]
    for rank, task in enumerate(tasks.values()):
        script = task["files"][0]["contents"]
        assert f"torchrun --nnodes 2 --nproc_per_node 2 --node_rank {rank}" in script, script
        assert "--total_epochs 10 " in script, script
    assert rendered["workflow"]["resources"]["default"]["gpu"] == 2
    dataset = tasks["master"]["outputs"][0]["dataset"]["name"]
    assert dataset == "torchrun-multinode-model"
    assert f"$ty dataset info {dataset}" in text


# ---------------------------------------------------------------- heterogeneous, pytorch_dist


def test_heterogeneous_example_trains_a_world_of_three_over_2_and_1_processes(
    runner: EngineRun,
) -> None:
    epochs = 3
    wid = runner.submit(
        HETEROGENEOUS,
        {
            "n_epochs": epochs,
            "master_port": free_port(),
            "output_dataset": "heterogeneous-test-model",
        },
    )
    assert runner.wait(wid) == "COMPLETED", runner.logs(wid)
    statuses = _statuses(runner, wid)
    assert statuses["master"] == ("COMPLETED", 0, 0), statuses
    assert statuses["worker"][0::2] == ("COMPLETED", 0) and statuses["worker"][1] in (0, None), (
        statuses
    )

    log = runner.log(wid, "master")
    assert [(e, t) for e, t, _ in _epochs_in_log(log)] == [
        (e, epochs) for e in range(1, epochs + 1)
    ], log[-3000:]
    assert (
        "Number of nodes: 2\nNumber of processes per node: 2, 1\nTotal processes used: 3\n"
        "Training completed successfully."
    ) in _summary_block(log)

    output = runner.run_dir(wid, "master") / "output" / "models"
    records = metrics(output)
    start, summary = records[0], records[-1]
    assert start["event"] == "start" and start["world_size"] == 3 and start["nodes"] == 2, start
    assert start["workers_per_node"] == [2, 1], start
    assert summary["event"] == "summary" and summary["world_size"] == 3, summary
    assert summary["workers_per_node"] == [2, 1] and summary["last_epoch"] == epochs, summary
    info = _store(runner).info("heterogeneous-test-model")
    assert [v.version for v in info.versions] == [1]
    assert {f.path for f in info.versions[0].files} == {"snapshot.pth", "metrics.jsonl"}


def test_pytorch_dist_example_trains_with_the_launcher_on_two_nodes(runner: EngineRun) -> None:
    """No torchrun: each task's launcher starts its processes with RANK = offset + local
    rank; the defaults' 2 nodes x 2 processes (ranks 0-1 on the master, 2-3 on the worker)."""
    epochs = 3
    wid = runner.submit(
        PYTORCH_DIST,
        {
            "n_epochs": epochs,
            "master_port": free_port(),
            "output_dataset": "pytorch-dist-test-model",
        },
    )
    assert runner.wait(wid) == "COMPLETED", runner.logs(wid)
    statuses = _statuses(runner, wid)
    assert statuses["master"] == ("COMPLETED", 0, 0), statuses
    assert statuses["worker_1"][0::2] == ("COMPLETED", 0) and statuses["worker_1"][1] in (
        0,
        None,
    ), statuses

    log, worker_log = runner.log(wid, "master"), runner.log(wid, "worker_1")
    # the scripts' `set -x` echoes what each task ran
    assert "python -m trainyard.training.launch --offset 0 --size 2 --world_size 4" in log, log[
        -3000:
    ]
    assert "python -m trainyard.training.launch --offset 2 --size 2 --world_size 4" in worker_log, (
        worker_log[-3000:]
    )
    assert "torchrun" not in log + worker_log
    assert [(e, t) for e, t, _ in _epochs_in_log(log)] == [
        (e, epochs) for e in range(1, epochs + 1)
    ], log[-3000:]
    assert (
        "Number of nodes: 2\nNumber of processes per node: 2\nTotal processes used: 4\n"
        in _summary_block(log)
    )
    records = metrics(runner.run_dir(wid, "master") / "output" / "models")
    start, summary = records[0], records[-1]
    assert (
        start["event"] == "start"
        and start["world_size"] == 4
        and start["workers_per_node"] == [2, 2]
    ), start
    assert (
        summary["event"] == "summary"
        and summary["last_epoch"] == epochs
        and summary["world_size"] == 4
    ), summary
    assert [v.version for v in _store(runner).info("pytorch-dist-test-model").versions] == [1]
