"""Report lines are exactly the Slurm seed's; metrics.jsonl has one JSON record per line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from training_support import metrics, run_trainer

from trainyard.training.report import MetricsLog, epoch_lines, summary_lines

EPOCH = re.compile(r"^Epoch (\d+)/(\d+) completed in \d+\.\d{3} seconds$")
VALIDATION = re.compile(r"^Validation Loss: \d+\.\d{4}, Validation Accuracy: [01]\.\d{4}$")
THROUGHPUT = re.compile(r"^Epoch Throughput: \d+\.\d{3} images/second$")


def test_epoch_lines_match_the_seed_byte_for_byte() -> None:
    assert epoch_lines(95, 100, 0.7712, 1.19981, 0.71014, 63787.9261) == [
        "Epoch 95/100 completed in 0.771 seconds",
        "Validation Loss: 1.1998, Validation Accuracy: 0.7101",
        "Epoch Throughput: 63787.926 images/second",
    ]


def test_summary_block_on_gpus_matches_the_seed() -> None:
    assert summary_lines(77.7841, 63190.1724, [4, 4], "GPU") == [
        "",
        "Training Summary:",
        "Total training time: 77.784 seconds",
        "Throughput: 63190.172 images/second",
        "Number of nodes: 2",
        "Number of GPUs per node: 4",
        "Total GPUs used: 8",
        "Training completed successfully.",
    ]


def test_summary_on_cpus_counts_processes_and_lists_uneven_nodes() -> None:
    lines = summary_lines(1.0, 2.0, [2, 1], "process")
    assert lines[4:7] == [
        "Number of nodes: 2",
        "Number of processes per node: 2, 1",
        "Total processes used: 3",
    ]


def test_a_run_prints_three_seed_lines_per_epoch_and_the_summary(tmp_path: Path) -> None:
    code, out = run_trainer("--total_epochs", "3", "--snapshot_path", str(tmp_path / "s.pth"))
    assert code == 0
    lines = out.splitlines()
    body, summary = lines[: lines.index("")], lines[lines.index("") :]
    assert len(body) == 9
    for i in range(3):
        match = EPOCH.match(body[3 * i])
        assert match and match.groups() == (str(i + 1), "3"), body[3 * i]
        assert VALIDATION.match(body[3 * i + 1]), body[3 * i + 1]
        assert THROUGHPUT.match(body[3 * i + 2]), body[3 * i + 2]
    assert summary[1] == "Training Summary:" and summary[-1] == "Training completed successfully."
    assert re.match(r"^Total training time: \d+\.\d{3} seconds$", summary[2])
    assert re.match(r"^Throughput: \d+\.\d{3} images/second$", summary[3])
    assert summary[4:7] == [
        "Number of nodes: 1",
        "Number of processes per node: 1",
        "Total processes used: 1",
    ]


def test_metrics_carry_the_printed_figures(tmp_path: Path) -> None:
    _, out = run_trainer("--total_epochs", "2", "--snapshot_path", str(tmp_path / "s.pth"))
    records = metrics(tmp_path)
    assert [r["event"] for r in records] == ["start", "epoch", "epoch", "summary"]
    epoch = records[2]
    assert (
        f"Validation Loss: {epoch['val_loss']:.4f}, Validation Accuracy: {epoch['val_accuracy']:.4f}"
        in out
    )
    assert f"Epoch 2/2 completed in {epoch['epoch_time_s']:.3f} seconds" in out
    assert epoch["images"] == 1437 and epoch["snapshot_saved"] is True
    assert abs(epoch["throughput_images_per_s"] - epoch["images"] / epoch["epoch_time_s"]) < 1e-6
    summary = records[-1]
    assert f"Throughput: {summary['throughput_images_per_s']:.3f} images/second" in out
    assert (
        summary["images"] == 2 * 1437
        and summary["nodes"] == 1
        and summary["workers_per_node"] == [1]
    )
    assert summary["final_val_accuracy"] == epoch["val_accuracy"]


def test_metrics_log_appends_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path / "m")
    log.write("start", world_size=4)
    log.write("epoch", epoch=1, val_accuracy=0.5)
    with log.path.open("a") as handle:
        handle.write('{"event": "epo')
    assert [r["event"] for r in log.read()] == ["start", "epoch"]
    assert json.loads(log.path.read_text().splitlines()[0])["world_size"] == 4
