"""Example specs run the way a task runner runs them: each task's script with its tokens
resolved, all tasks of the group started together, here with two stand-in nodes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from training_integration_support import (
    EXAMPLES,
    free_port,
    metrics,
    run_task_scripts,
    task_scripts,
)

pytestmark = pytest.mark.slow


def test_template_with_barrier_trains_on_two_nodes(tmp_path: Path) -> None:
    scripts = task_scripts(
        EXAMPLES / "torchrun_multinode" / "train_template.yaml",
        {
            "use_barrier": True,
            "n_gpus_per_node": 1,
            "n_epochs": 3,
            "master_port": free_port(),
            "barrier_port": free_port(),
            "barrier_timeout_s": 120,
        },
    )
    tasks = run_task_scripts(scripts, tmp_path)
    assert {n: t.returncode for n, t in tasks.items()} == {"master": 0, "worker_1": 0}, tasks[
        "master"
    ].output[-3000:]
    assert "all 2 ranks arrived, released" in tasks["worker_1"].output
    summary = metrics(tmp_path / "master" / "output" / "models")[-1]
    assert summary["event"] == "summary" and summary["nodes"] == 2 and summary["last_epoch"] == 3


def test_reschedule_example_fails_once_then_resumes_from_the_uploaded_snapshot(
    tmp_path: Path,
) -> None:
    """Two attempts of the group, the engine's part played by hand: exit code 3 -> reschedule,
    the lead's checkpoint folder -> the next attempt's input."""
    values = {
        "n_gpus_per_node": 1,
        "n_epochs": 4,
        "fail_at_epoch": 3,
        "upload_location": "s3://bucket/upload",
    }  # not used: the upload is played by hand below
    inputs = {"master": tmp_path / "upload", "worker_1": tmp_path / "upload"}
    first = run_task_scripts(
        task_scripts(
            EXAMPLES / "torchrun_reschedule" / "train.yaml", {**values, "master_port": free_port()}
        ),
        tmp_path / "attempt1",
        inputs,
    )
    assert {n: t.returncode for n, t in first.items()} == {"master": 3, "worker_1": 3}, first[
        "master"
    ].output[-3000:]
    assert (tmp_path / "attempt1" / "worker_1" / "tmp" / "training_errors.log.1").is_file()
    assert "rescheduling the task" in first["master"].output
    assert "training from scratch" in first["master"].output

    # the checkpoint upload: the lead's /tmp/models goes to upload_location
    shutil.copytree(
        tmp_path / "attempt1" / "master" / "tmp" / "models", tmp_path / "upload" / "models"
    )
    second = run_task_scripts(
        task_scripts(
            EXAMPLES / "torchrun_reschedule" / "train.yaml", {**values, "master_port": free_port()}
        ),
        tmp_path / "attempt2",
        inputs,
    )
    assert {n: t.returncode for n, t in second.items()} == {"master": 0, "worker_1": 0}, second[
        "master"
    ].output[-3000:]
    assert "Found snapshot" in second["worker_1"].output
    assert "continuing at epoch 3" in second["master"].output
    records = metrics(tmp_path / "attempt2" / "master" / "output" / "models")
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == [3, 4]
