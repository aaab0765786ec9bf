"""The trainer under real torchrun: two stand-in nodes on this machine talking gloo."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from training_integration_support import BIN, free_port, metrics, run_nodes, torchrun_cmd

pytestmark = pytest.mark.slow


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """Two nodes of two processes, 10 epochs on digits, as the examples' defaults."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    port = free_port()
    nodes = run_nodes(
        [
            torchrun_cmd(
                rank, 2, 2, port, ["--snapshot_path", str(folder / f"node{rank}" / "snapshot.pth")]
            )
            for rank in (0, 1)
        ]
    )
    assert [n.returncode for n in nodes] == [0, 0], (
        nodes[0].output[-3000:] + nodes[1].output[-3000:]
    )
    (folder / "node0" / "stdout.txt").write_text(nodes[0].output)
    return folder


def test_two_nodes_of_two_processes_reach_095_on_digits(uninterrupted: Path) -> None:
    out = (uninterrupted / "node0" / "stdout.txt").read_text()
    assert "Epoch 10/10 completed in" in out
    assert "Number of nodes: 2\nNumber of processes per node: 2\nTotal processes used: 4\n" in out
    records = metrics(uninterrupted / "node0")
    summary = records[-1]
    assert summary["event"] == "summary" and summary["world_size"] == 4 and summary["nodes"] == 2
    assert summary["final_val_accuracy"] >= 0.95, summary
    assert records[0]["backend"] == "gloo"
    assert not (uninterrupted / "node1" / "metrics.jsonl").exists(), (
        "only global rank 0 writes metrics"
    )
    # every node keeps a copy of the newest snapshot, and the copies agree
    first, second = (
        _weights(uninterrupted / "node0" / "snapshot.pth"),
        _weights(uninterrupted / "node1" / "snapshot.pth"),
    )
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_failure_at_epoch_k_resumes_at_k_and_ends_as_an_uninterrupted_run(
    tmp_path: Path, uninterrupted: Path
) -> None:
    def attempt() -> list:
        port = free_port()
        return run_nodes(
            [
                torchrun_cmd(
                    rank,
                    2,
                    2,
                    port,
                    [
                        "--snapshot_path",
                        str(tmp_path / f"node{rank}") + "/",
                        "--fail-at-epoch",
                        "3",
                        "--error_log",
                        str(tmp_path / f"node{rank}" / "errors.log"),
                    ],
                )
                for rank in (0, 1)
            ]
        )

    first = attempt()
    assert all(n.returncode != 0 for n in first)
    for rank in range(4):  # every rank fails at the same step and leaves its error log
        log = tmp_path / f"node{rank // 2}" / f"errors.log.{rank}"
        assert "InjectedFailure: --fail-at-epoch 3" in log.read_text()
    records = metrics(tmp_path / "node0")
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == [1, 2]
    assert records[-1]["event"] == "failure" and records[-1]["epoch"] == 3

    second = attempt()  # the rerun, same command line
    assert [n.returncode for n in second] == [0, 0], second[0].output[-3000:]
    assert "continuing at epoch 3" in second[0].output
    records = metrics(tmp_path / "node0")
    start = [r for r in records if r["event"] == "start"][-1]
    assert start["first_epoch"] == 3 and start["epochs_completed"] == 2
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == list(range(1, 11))

    ours, theirs = (
        _weights(tmp_path / "node0" / "snapshot.pth"),
        _weights(uninterrupted / "node0" / "snapshot.pth"),
    )
    assert all(torch.equal(ours[k], theirs[k]) for k in ours), (
        "resumed weights differ from an uninterrupted run"
    )
    for node in ("node0", "node1"):  # and each node's whole snapshot, byte for byte (issue 29)
        assert (tmp_path / node / "snapshot.pth").read_bytes() == (
            uninterrupted / node / "snapshot.pth"
        ).read_bytes(), node
    reference = {
        r["epoch"]: r["val_accuracy"]
        for r in metrics(uninterrupted / "node0")
        if r["event"] == "epoch"
    }
    resumed = {
        r["epoch"]: r["val_accuracy"]
        for r in records
        if r["event"] == "epoch" and r["time"] > start["time"]
    }
    assert resumed == {e: reference[e] for e in range(3, 11)}


def test_uneven_nodes_with_the_manual_launcher(tmp_path: Path) -> None:
    port = str(free_port())
    launch = [
        str(BIN / "python"),
        "-m",
        "trainyard.training.launch",
        "--world_size",
        "3",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        port,
    ]
    train = ["-m", "trainyard.training.train", "--total_epochs", "2"]
    nodes = run_nodes(
        [
            [
                *launch,
                "--offset",
                "0",
                "--size",
                "2",
                *train,
                "--snapshot_path",
                str(tmp_path / "node0") + "/",
            ],
            [
                *launch,
                "--offset",
                "2",
                "--size",
                "1",
                *train,
                "--snapshot_path",
                str(tmp_path / "node1") + "/",
            ],
        ]
    )
    assert [n.returncode for n in nodes] == [0, 0], nodes[0].output[-3000:]
    assert (
        "Number of nodes: 2\nNumber of processes per node: 2, 1\nTotal processes used: 3\n"
        in nodes[0].output
    )
    start = metrics(tmp_path / "node0")[0]
    assert start["world_size"] == 3 and start["workers_per_node"] == [2, 1]
