"""Issue 29: the trainer's runs are reproducible and say so. The same flags give the same
weights and the same snapshot bytes (a plain checksum compares two runs); a changed flag
changes them; the snapshot and metrics.jsonl record seed, world size, torch version and
deterministic mode; ``--deterministic`` switches torch's deterministic algorithms on."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from training_support import load_weights, metrics, run_trainer

from trainyard.training.determinism import CUBLAS_WORKSPACE, enable_deterministic
from trainyard.training.snapshot import encode_snapshot, load_snapshot, save_snapshot

EPOCHS = "2"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _train(folder: Path, *extra: str) -> Path:
    """Train EPOCHS epochs into ``folder``; returns the snapshot's path."""
    snapshot = folder / "snapshot.pth"
    code, _ = run_trainer("--total_epochs", EPOCHS, "--snapshot_path", str(snapshot), *extra)
    assert code == 0
    return snapshot


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def torch_determinism() -> Iterator[None]:
    """Give back torch's deterministic settings and CUBLAS_WORKSPACE_CONFIG after a test that
    runs the trainer with ``--deterministic`` in this process."""
    algorithms = torch.are_deterministic_algorithms_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    yield
    torch.use_deterministic_algorithms(algorithms)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
    if cublas is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = cublas


def test_two_runs_with_the_same_flags_write_byte_identical_snapshots(tmp_path: Path) -> None:
    first, second = _train(tmp_path / "a"), _train(tmp_path / "b")
    assert _sha256(first) == _sha256(second)
    assert _same_tensors(load_weights(first), load_weights(second))


def test_a_changed_batch_size_changes_the_weights_and_the_checksum(tmp_path: Path) -> None:
    first, other = _train(tmp_path / "a"), _train(tmp_path / "b", "--batch_size", "64")
    assert _sha256(first) != _sha256(other)
    assert not _same_tensors(load_weights(first), load_weights(other))


def test_the_snapshot_records_what_reproducing_it_needs(tmp_path: Path) -> None:
    state = load_snapshot(_train(tmp_path, "--seed", "7"))
    assert state is not None
    assert state["reproducibility"] == {
        "seed": 7,
        "world_size": 1,
        "torch_version": torch.__version__,
        "deterministic": False,
        "backend": "gloo",
        "device_type": "cpu",
    }


def test_metrics_record_seed_world_size_torch_version_and_mode(tmp_path: Path) -> None:
    _train(tmp_path, "--seed", "3")
    records = {r["event"]: r for r in metrics(tmp_path)}
    for event in ("start", "summary"):
        row = records[event]
        assert (row["seed"], row["world_size"], row["torch_version"], row["deterministic"]) == (
            3,
            1,
            torch.__version__,
            False,
        ), row


def test_deterministic_mode_is_switched_on_and_recorded(
    tmp_path: Path, torch_determinism: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    plain = _train(tmp_path / "plain")
    assert not torch.are_deterministic_algorithms_enabled()
    strict = _train(tmp_path / "strict", "--deterministic")
    assert torch.are_deterministic_algorithms_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    state = load_snapshot(strict)
    assert state is not None and state["reproducibility"]["deterministic"] is True
    assert [
        r["deterministic"]
        for r in metrics(tmp_path / "strict")
        if r["event"] in ("start", "summary")
    ] == [True, True]
    # On CPUs the kernels were deterministic already: the same weights, only the record differs.
    assert _same_tensors(load_weights(plain), load_weights(strict))
    assert _sha256(plain) != _sha256(strict)


def test_enable_deterministic_keeps_a_workspace_setting_of_the_user(
    torch_determinism: None,
) -> None:
    environ = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    enable_deterministic(environ)
    assert environ == {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    assert torch.are_deterministic_algorithms_enabled()


def _state(value: float) -> dict[str, object]:
    return {
        "epochs_completed": 1,
        "model": {"w": torch.full((3, 2), value)},
        "optimizer": {},
        "scheduler": {},
        "rng": {"torch": torch.arange(4)},
    }


def test_the_same_state_gives_the_same_bytes_whatever_the_file_is_called(tmp_path: Path) -> None:
    save_snapshot(tmp_path / "a" / "snapshot.pth", _state(1.0))
    save_snapshot(tmp_path / "b" / "other name.pt", _state(1.0))
    first = (tmp_path / "a" / "snapshot.pth").read_bytes()
    assert first == (tmp_path / "b" / "other name.pt").read_bytes() == encode_snapshot(_state(1.0))
    assert first != encode_snapshot(_state(2.0))


def test_a_snapshot_holds_no_timestamp(tmp_path: Path) -> None:
    entries = zipfile.ZipFile(io.BytesIO(encode_snapshot(_state(1.0)))).infolist()
    assert entries and {e.date_time for e in entries} == {(1980, 0, 0, 0, 0, 0)}


def test_shared_or_separate_objects_of_equal_value_give_the_same_bytes() -> None:
    """Pickle refers back to an object it wrote before (by identity): the same values, shared
    in one state and separate in the other (a resumed run's optimizer state comes from a
    file), must still give the same bytes."""
    key = "".join(["l", "r"])  # a str object of its own, not the interned literal
    shared_group = {"lr": 0.1, "momentum": 0.9}
    shared = {
        **_state(1.0),
        "optimizer": {"param_groups": [shared_group, shared_group]},
        "config": {key: 0.1},
    }
    separate = {
        **_state(1.0),
        "config": {"lr": 0.1},
        "optimizer": {"param_groups": [{"lr": 0.1, "momentum": 0.9}, {"lr": 0.1, "momentum": 0.9}]},
    }
    assert encode_snapshot(shared) == encode_snapshot(separate)


def test_a_state_dicts_metadata_survives_the_canonical_form(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    save_snapshot(tmp_path / "s.pth", {**_state(1.0), "model": model.state_dict()})
    state = load_snapshot(tmp_path / "s.pth")
    assert state is not None and state["model"]._metadata == model.state_dict()._metadata
    torch.nn.Linear(2, 2).load_state_dict(state["model"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (nccl, cuDNN, cuBLAS)")
def test_deterministic_gpu_runs_write_the_same_snapshot(tmp_path: Path) -> None:
    """On a GPU, ``--deterministic`` makes two runs of the CNN (cuDNN convolutions, cuBLAS
    GEMMs) end with the same weights and the same snapshot bytes. Each run is a process of
    its own: CUDA and torch's deterministic switch are settings of the process."""
    snapshots = []
    for name in ("a", "b"):
        snapshot = tmp_path / name / "snapshot.pth"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainyard.training.train",
                "--total_epochs",
                EPOCHS,
                "--model",
                "cnn",
                "--deterministic",
                "--snapshot_path",
                str(snapshot),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        snapshots.append(snapshot)
    state = load_snapshot(snapshots[0])
    assert state is not None and state["reproducibility"]["device_type"] == "cuda"
    assert state["reproducibility"]["deterministic"] is True
    assert _same_tensors(load_weights(snapshots[0]), load_weights(snapshots[1]))
    assert _sha256(snapshots[0]) == _sha256(snapshots[1])
