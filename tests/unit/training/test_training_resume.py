"""Resume from epoch k equals an uninterrupted run; failure injection fires once; early stop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from training_support import load_weights, metrics, run_trainer

from trainyard.training.snapshot import encode_snapshot, load_snapshot

EPOCHS = "5"


def _epochs(records: list[dict]) -> dict[int, tuple[float, float, float]]:
    return {
        r["epoch"]: (r["train_loss"], r["val_loss"], r["val_accuracy"])
        for r in records
        if r["event"] == "epoch"
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("uninterrupted")
    code, _ = run_trainer("--total_epochs", EPOCHS, "--snapshot_path", str(folder / "snapshot.pth"))
    assert code == 0
    return folder


@pytest.mark.parametrize("fail_at, save_every, resumes_at", [(3, 1, 3), (4, 2, 3), (5, 2, 5)])
def test_resume_after_a_failure_equals_an_uninterrupted_run(
    tmp_path: Path, uninterrupted: Path, fail_at: int, save_every: int, resumes_at: int
) -> None:
    args = [
        "--total_epochs",
        EPOCHS,
        "--snapshot_path",
        str(tmp_path / "snapshot.pth"),
        "--save_every",
        str(save_every),
        "--fail-at-epoch",
        str(fail_at),
        "--error_log",
        str(tmp_path / "errors.log"),
    ]
    code, out = run_trainer(*args)
    assert code == 1
    assert (tmp_path / "errors.log.0").read_text().count("InjectedFailure") >= 1
    assert f"Epoch {fail_at}/{EPOCHS}" not in out
    assert load_snapshot(tmp_path / "snapshot.pth")["epochs_completed"] == resumes_at - 1

    code, out = run_trainer(*args)  # the rescheduled run: same command line
    assert code == 0, "the injected failure must not fire again after a resume"
    assert f"continuing at epoch {resumes_at}" in out
    assert f"Epoch {resumes_at - 1}/{EPOCHS}" not in out.split("continuing")[1]

    records = metrics(tmp_path)
    assert [r["event"] for r in records].count("failure") == 1
    starts = [r for r in records if r["event"] == "start"]
    assert [s["first_epoch"] for s in starts] == [1, resumes_at]
    reference, resumed = (
        load_weights(uninterrupted / "snapshot.pth"),
        load_weights(tmp_path / "snapshot.pth"),
    )
    assert all(torch.equal(reference[k], resumed[k]) for k in reference), "weights differ bitwise"
    # and the whole snapshot, RNG states included, is byte for byte the uninterrupted run's
    # (issue 29: a plain checksum compares two runs)
    assert (tmp_path / "snapshot.pth").read_bytes() == (uninterrupted / "snapshot.pth").read_bytes()
    ours = _epochs([r for r in records if r["time"] >= starts[1]["time"]])
    theirs = _epochs(metrics(uninterrupted))
    assert ours == {e: theirs[e] for e in range(resumes_at, int(EPOCHS) + 1)}


def test_a_finished_snapshot_means_nothing_to_do(tmp_path: Path, uninterrupted: Path) -> None:
    (tmp_path / "snapshot.pth").write_bytes((uninterrupted / "snapshot.pth").read_bytes())
    code, out = run_trainer("--total_epochs", EPOCHS, "--snapshot_path", str(tmp_path))
    assert code == 0
    assert "Nothing to do: the snapshot has 5 of 5 epochs completed" in out
    assert "Epoch " not in out


def test_more_epochs_continue_a_finished_run(tmp_path: Path, uninterrupted: Path) -> None:
    (tmp_path / "snapshot.pth").write_bytes((uninterrupted / "snapshot.pth").read_bytes())
    code, out = run_trainer(
        "--total_epochs", "6", "--snapshot_path", str(tmp_path / "snapshot.pth")
    )
    assert code == 0
    assert "continuing at epoch 6" in out and "Epoch 6/6 completed" in out


def test_a_corrupt_snapshot_stops_the_run_and_is_left_alone(
    tmp_path: Path, uninterrupted: Path, capsys
) -> None:
    damaged = (uninterrupted / "snapshot.pth").read_bytes()[:-200]
    (tmp_path / "snapshot.pth").write_bytes(damaged)
    code, out = run_trainer(
        "--total_epochs", EPOCHS, "--snapshot_path", str(tmp_path / "snapshot.pth")
    )
    assert code == 2
    assert "not a complete snapshot" in capsys.readouterr().err
    assert "Epoch " not in out
    assert (tmp_path / "snapshot.pth").read_bytes() == damaged


def test_a_snapshot_of_another_model_is_refused(
    tmp_path: Path, uninterrupted: Path, capsys
) -> None:
    (tmp_path / "snapshot.pth").write_bytes((uninterrupted / "snapshot.pth").read_bytes())
    code, _ = run_trainer("--model", "cnn", "--snapshot_path", str(tmp_path / "snapshot.pth"))
    assert code == 2
    assert "does not fit --model cnn" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--fail-at-epoch", "1"], "needs a snapshot before it"),
        (["--fail-at-epoch", "3", "--save_every", "3"], "needs a snapshot before it"),
        (["--fail-at-epoch", "11"], "must lie in [1, --total_epochs=10]"),
        (["--batch_size", "0"], "--batch_size must be at least 1"),
        (["--target-accuracy", "1.5"], "--target-accuracy must lie in (0, 1]"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_error(tmp_path: Path, capsys, argv, message) -> None:
    code, _ = run_trainer("--snapshot_path", str(tmp_path / "s.pth"), *argv)
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.pth").exists()


def test_early_stop_after_patience_epochs_at_target(tmp_path: Path, uninterrupted: Path) -> None:
    accuracy = {e: v[2] for e, v in _epochs(metrics(uninterrupted)).items()}
    target, patience = 0.965, 2
    expected = next(
        e for e in range(patience, 6) if all(accuracy[e - i] >= target for i in range(patience))
    )
    assert expected < 5, "the test needs a run that reaches the target early"
    args = [
        "--total_epochs",
        EPOCHS,
        "--snapshot_path",
        str(tmp_path / "snapshot.pth"),
        "--target-accuracy",
        str(target),
        "--patience",
        str(patience),
        "--save_every",
        "3",
    ]
    code, out = run_trainer(*args)
    assert code == 0
    assert f"Epoch {expected}/{EPOCHS} completed" in out
    assert f"Epoch {expected + 1}/{EPOCHS}" not in out
    assert (
        f"Early stopping: validation accuracy {accuracy[expected]:.4f} >= 0.9650 for 2 consecutive"
        in out
    )
    records = metrics(tmp_path)
    assert [r["epoch"] for r in records if r["event"] == "early_stop"] == [expected]
    assert records[-1]["event"] == "summary" and records[-1]["early_stopped"] is True
    state = load_snapshot(tmp_path / "snapshot.pth")
    assert state["epochs_completed"] == expected and state["early_stopped"] is True

    code, out = run_trainer(*args)  # a rerun does not train past an early stop
    assert code == 0 and "stopped early" in out and "Epoch " not in out


def test_patience_counter_resets_below_target(tmp_path: Path, uninterrupted: Path) -> None:
    code, out = run_trainer(
        "--total_epochs",
        "3",
        "--snapshot_path",
        str(tmp_path / "s.pth"),
        "--target-accuracy",
        "0.9999",
        "--patience",
        "1",
    )
    assert code == 0 and "Early stopping" not in out
    assert load_snapshot(tmp_path / "s.pth")["early_stop"]["epochs_at_target"] == 0


def test_snapshot_path_may_name_a_folder_and_metrics_follow_it(tmp_path: Path) -> None:
    code, _ = run_trainer("--total_epochs", "1", "--snapshot_path", str(tmp_path) + "/")
    assert code == 0
    assert (tmp_path / "snapshot.pth").is_file() and (tmp_path / "metrics.jsonl").is_file()
    other = tmp_path / "elsewhere"
    code, _ = run_trainer(
        "--total_epochs",
        "2",
        "--snapshot_path",
        str(tmp_path / "snapshot.pth"),
        "--metrics-dir",
        str(other),
    )
    assert code == 0 and [r["first_epoch"] for r in metrics(other) if r["event"] == "start"] == [2]


def test_the_snapshot_holds_the_whole_training_state(tmp_path: Path) -> None:
    run_trainer("--total_epochs", "2", "--snapshot_path", str(tmp_path / "snapshot.pth"))
    state = load_snapshot(tmp_path / "snapshot.pth")
    assert {
        "model",
        "optimizer",
        "scheduler",
        "rng",
        "epochs_completed",
        "sampler_epoch",
        "early_stop",
    } <= set(state)
    assert state["optimizer"]["state"], "momentum buffers are saved"
    assert state["scheduler"]["last_epoch"] == 2 and state["sampler_epoch"] == 2
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert encode_snapshot({k: v for k, v in state.items() if k not in ("format", "sha256")})


def test_resuming_with_other_settings_warns(tmp_path: Path, uninterrupted: Path, capsys) -> None:
    (tmp_path / "snapshot.pth").write_bytes((uninterrupted / "snapshot.pth").read_bytes())
    code, _ = run_trainer(
        "--total_epochs", "6", "--seed", "7", "--snapshot_path", str(tmp_path / "snapshot.pth")
    )
    assert code == 0
    assert "changed settings (seed 0 -> 7)" in capsys.readouterr().err
