"""The elastic and reschedule examples through the real engine on the local pool: every task a
sandboxed task runner process started by the local backend, statuses decided by the engine's
state machine, outputs uploaded by the runners. Small settings (1 process per node, a few
epochs of the MLP on digits) keep each test well under two minutes on a 2-core machine.

- elastic: the worker task's processes are SIGKILLed once an epoch is done; torchrun on the
  master restarts its worker, the c10d rendezvous closes with the one node left, training
  resumes from the master's snapshot and the lead COMPLETES (the worker's failure does not
  fail the group: ``ignoreNonleadStatus`` defaults to true).
- reschedule: the injected failure makes every task exit 3, which the spec maps to
  RESCHEDULE; the engine starts retry 1 of the group, which downloads the snapshot the lead's
  checkpoint uploaded and resumes at the epoch that failed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from training_integration_support import (
    EXAMPLES,
    EngineRun,
    free_port,
    kill,
    metrics,
    runner,  # noqa: F401 (a fixture)
    task_processes,
    wait_until,
)

from trainyard.data.datasets import DatasetStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ELASTIC = EXAMPLES / "torchrun_elastic" / "train.yaml"
RESCHEDULE = EXAMPLES / "torchrun_reschedule" / "train.yaml"


def _statuses(runner: EngineRun, workflow_id: str) -> dict[str, tuple[str, int | None, int]]:
    tasks = runner.state(workflow_id).tasks
    return {name: (t.status.value, t.exit_code, t.retry_id) for name, t in tasks.items()}


def _history(runner: EngineRun, workflow_id: str, task: str) -> list[tuple[int, str, int | None]]:
    return [
        (a.retry_id, a.status.value, a.exit_code)
        for a in runner.state(workflow_id).tasks[task].history
    ]


def _continuing_at(log: str) -> int:
    found = re.findall(r"epochs completed, continuing at epoch (\d+)", log)
    assert len(found) == 1, log[-3000:]
    return int(found[0])


def test_elastic_training_goes_on_when_a_worker_is_killed(runner: EngineRun) -> None:
    epochs = 30
    wid = runner.submit(
        ELASTIC,
        {
            "n_gpus_per_node": 1,
            "min_nodes": 1,
            "max_nodes": 2,
            "n_epochs": epochs,
            "last_call_timeout_s": 2,
            "master_port": free_port(),
            "output_dataset": "elastic-test-model",
        },
    )
    runner.start()

    # Global rank 0 prints the epoch lines; kill the worker's whole command (shell, torchrun,
    # trainer) once two epochs are done with both nodes, leaving its task runner to report it.
    wait_until(
        lambda: any("Epoch 2/" in runner.log(wid, t) for t in ("master", "worker_1")),
        120,
        "epoch 2 of the two-node run",
    )
    victims = task_processes(wid, "worker_1")
    assert any("torchrun" in " ".join(p.cmdline()) for p in victims), [p.cmdline() for p in victims]
    kill(victims)

    assert runner.wait(wid) == "COMPLETED", runner.logs(wid)
    statuses = _statuses(runner, wid)
    assert statuses["master"] == ("COMPLETED", 0, 0), statuses
    assert statuses["worker_1"][0] == "FAILED" and statuses["worker_1"][1] != 0, statuses

    log = runner.log(wid, "master")
    resumed_at = _continuing_at(log)
    assert 3 <= resumed_at <= epochs, log[-3000:]  # not from scratch: after the 2 epochs seen
    assert "Training completed successfully." in log

    output = runner.run_dir(wid, "master") / "output" / "models"
    records = metrics(output)
    starts = [r for r in records if r["event"] == "start"]
    assert starts[-1]["world_size"] == 1 and starts[-1]["first_epoch"] == resumed_at, starts
    assert any(r["event"] == "failure" and not r["injected"] for r in records), (
        "the master's worker saw the loss"
    )
    summary = records[-1]
    assert (
        summary["event"] == "summary" and summary["nodes"] == 1 and summary["last_epoch"] == epochs
    ), summary
    assert summary["final_val_accuracy"] > 0.9, summary
    assert [r["epoch"] for r in records if r["event"] == "epoch"][
        -(epochs - resumed_at + 1) :
    ] == list(range(resumed_at, epochs + 1))

    # the lead's output: the final snapshot, stored as a version of the output dataset
    assert torch.load(output / "snapshot.pth", weights_only=True)["epochs_completed"] == epochs
    info = DatasetStore(f"file://{runner.home / 'datasets'}").info("elastic-test-model")
    assert [v.version for v in info.versions] == [1]
    assert {f.path for f in info.versions[0].files} >= {"snapshot.pth", "metrics.jsonl"}


def test_reschedule_resumes_from_the_uploaded_snapshot(runner: EngineRun, tmp_path: Path) -> None:
    epochs, fail_at = 6, 4
    upload = runner.home / "storage" / "tester" / "upload"  # below the submitter's data root
    wid = runner.submit(
        RESCHEDULE,
        {
            "n_gpus_per_node": 1,
            "n_nodes": 2,
            "n_epochs": epochs,
            "fail_at_epoch": fail_at,
            "master_port": free_port(),
            "upload_location": upload.as_uri(),
        },
    )
    # Nothing is at the upload location before the first run: its url input is an empty
    # folder, as OSMO's sample expects.
    assert not upload.exists()

    assert runner.wait(wid) == "COMPLETED", runner.logs(wid)
    statuses = _statuses(runner, wid)
    assert statuses["master"] == ("COMPLETED", 0, 1), statuses
    # the worker ends by itself (0) or is stopped by the lead's end (no exit code of its own)
    assert statuses["worker_1"][0::2] == ("COMPLETED", 1) and statuses["worker_1"][1] in (
        0,
        None,
    ), statuses
    # retry 0 ended RESCHEDULED: each task exited 3 (RESCHEDULE), or was stopped by the
    # group's reschedule when the other one got there first
    for task in ("master", "worker_1"):
        history = _history(runner, wid, task)
        assert [h[:2] for h in history] == [(0, "RESCHEDULED")], history
        assert history[0][2] in (3, 143, None), history
    assert any(_history(runner, wid, t)[0][2] == 3 for t in ("master", "worker_1"))

    first = runner.log(wid, "master", 0)
    assert "training from scratch" in first, first[-3000:]
    assert f"InjectedFailure: --fail-at-epoch {fail_at}" in first + runner.log(wid, "worker_1", 0)

    second = runner.log(wid, "master", 1)
    assert "Found snapshot" in second and "Found snapshot" in runner.log(wid, "worker_1", 1)
    assert _continuing_at(second) == fail_at, second[-3000:]
    assert "InjectedFailure" not in second

    output = runner.run_dir(wid, "master", 1) / "output" / "models"
    records = metrics(output)
    start = [r for r in records if r["event"] == "start"][-1]
    assert (
        start["first_epoch"] == fail_at
        and start["epochs_completed"] == fail_at - 1
        and start["world_size"] == 2
    )
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == list(
        range(fail_at, epochs + 1)
    )
    summary = records[-1]
    assert summary["event"] == "summary" and summary["final_val_accuracy"] > 0.9, summary

    # outputs: the final snapshot in the lead's {{output}}, and the checkpoint upload
    assert torch.load(output / "snapshot.pth", weights_only=True)["epochs_completed"] == epochs
    uploaded = upload / wid / "models" / "snapshot.pth"
    assert torch.load(uploaded, weights_only=True)["epochs_completed"] == epochs
