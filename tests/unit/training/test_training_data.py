"""Dataset loaders read the real file formats: bundled digits, MNIST IDX, CIFAR-10 pickles."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from training_support import metrics, run_trainer, write_cifar10, write_mnist

from trainyard.training.data import (
    load_cifar10,
    load_dataset,
    load_digits,
    load_mnist,
    read_idx,
    write_idx,
)
from trainyard.training.errors import DatasetError


def _unstandardise(splits, raw_train: np.ndarray, scale: float) -> tuple[float, float]:
    train = raw_train.astype(np.float32) / scale
    return float(train.mean()), float(train.std())


def test_digits_has_a_fixed_split_of_1437_and_360() -> None:
    first, second = load_digits(), load_digits()
    assert first.train_x.shape == (1437, 1, 8, 8) and first.val_x.shape == (360, 1, 8, 8)
    assert np.array_equal(first.val_y, second.val_y) and np.array_equal(
        first.train_x, second.train_x
    )
    assert set(np.unique(first.val_y)) == set(range(10)) == set(np.unique(first.train_y))
    assert first.train_x.dtype == np.float32 and first.train_y.dtype == np.int64
    assert abs(first.train_x.mean()) < 1e-5 and abs(first.train_x.std() - 1) < 1e-4


def test_digits_are_scikit_learns_digits() -> None:
    from sklearn.datasets import load_digits as sk_digits

    bunch, ours = sk_digits(), load_digits()
    order = np.random.RandomState(0).permutation(len(bunch.target))
    train, val = order[360:], order[:360]
    assert np.array_equal(ours.val_y, bunch.target[val]) and np.array_equal(
        ours.train_y, bunch.target[train]
    )
    mean, std = _unstandardise(ours, bunch.images[train], 16.0)
    assert np.allclose((ours.val_x[:, 0] * std + mean) * 16.0, bunch.images[val], atol=1e-4)


@pytest.mark.parametrize("gz", [False, True])
def test_idx_roundtrip(tmp_path: Path, gz: bool) -> None:
    array = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = tmp_path / ("a.idx" + (".gz" if gz else ""))
    write_idx(path, array)
    raw = path.read_bytes()
    assert (gzip.decompress(raw) if gz else raw)[:4] == bytes([0, 0, 0x08, 3])
    assert np.array_equal(read_idx(path), array)
    write_idx(tmp_path / "i.idx", np.array([1, -2, 300], dtype=np.int32))
    assert read_idx(tmp_path / "i.idx").tolist() == [1, -2, 300]


@pytest.mark.parametrize("gz, layout", [(False, "."), (True, "."), (False, "MNIST/raw")])
def test_mnist_from_idx_files(tmp_path: Path, gz: bool, layout: str) -> None:
    arrays = write_mnist(tmp_path / layout, n_train=40, n_val=20, gz=gz)
    splits = load_mnist(tmp_path)
    assert splits.train_x.shape == (40, 1, 28, 28) and splits.val_x.shape == (20, 1, 28, 28)
    assert splits.train_y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert splits.val_y.tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()
    mean, std = _unstandardise(splits, arrays["train-images-idx3-ubyte"], 255.0)
    restored = splits.val_x[:, 0] * std + mean
    assert np.allclose(restored * 255.0, arrays["t10k-images-idx3-ubyte"], atol=1e-3)


def test_mnist_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte"):
        load_mnist(tmp_path)
    write_mnist(tmp_path, n_train=10, n_val=10)
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(
        b"\x00\x00\x08\x01\x00\x00\x00\x0b" + bytes(11)
    )
    with pytest.raises(DatasetError, match="do not match"):
        load_mnist(tmp_path)
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"PK\x03\x04junk")
    with pytest.raises(DatasetError, match="bad magic"):
        load_mnist(tmp_path)
    good = tmp_path / "good"
    write_mnist(good, n_train=10, n_val=10)
    images = good / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:-5])
    with pytest.raises(DatasetError, match="IDX body"):
        load_mnist(good)


@pytest.mark.parametrize("nested", [False, True])
def test_cifar10_from_python_batches(tmp_path: Path, nested: bool) -> None:
    folder = tmp_path / "cifar-10-batches-py" if nested else tmp_path
    batches = write_cifar10(folder, per_batch=6, n_test=7)
    splits = load_cifar10(tmp_path)
    assert splits.train_x.shape == (30, 3, 32, 32) and splits.val_x.shape == (7, 3, 32, 32)
    train_raw = np.concatenate([batches[f"data_batch_{i}"][b"data"] for i in range(1, 6)])
    assert splits.train_y.tolist() == sum(
        (batches[f"data_batch_{i}"][b"labels"] for i in range(1, 6)), []
    )
    mean, std = _unstandardise(splits, train_raw, 255.0)
    test = batches["test_batch"][b"data"]
    restored = (splits.val_x * std + mean) * 255.0
    # rows hold 1024 red, then 1024 green, then 1024 blue values, each row-major 32x32
    assert np.allclose(restored[3, 1, 2, 5], test[3, 1024 + 2 * 32 + 5], atol=1e-3)
    assert np.allclose(restored.reshape(7, -1), test, atol=1e-3)


def test_cifar10_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="data_batch_1"):
        load_cifar10(tmp_path)
    write_cifar10(tmp_path)
    with (tmp_path / "data_batch_3").open("wb") as handle:
        pickle.dump({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, handle)
    with pytest.raises(DatasetError, match="expected \\(N, 3072\\)"):
        load_cifar10(tmp_path)


def test_a_cifar_batch_cannot_run_code(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    write_cifar10(tmp_path)
    with (tmp_path / "test_batch").open("wb") as handle:
        pickle.dump({b"data": Evil(), b"labels": []}, handle)
    with pytest.raises(DatasetError, match="not allowed"):
        load_cifar10(tmp_path)
    assert not (tmp_path / "pwned").exists()


def test_load_dataset_checks_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="choose one of: digits, mnist, cifar10"):
        load_dataset("imagenet")
    with pytest.raises(DatasetError, match="needs --data-dir"):
        load_dataset("mnist")
    with pytest.raises(DatasetError, match="is not a folder"):
        load_dataset("cifar10", tmp_path / "absent")


@pytest.mark.parametrize("dataset, model", [("mnist", "cnn"), ("cifar10", "mlp")])
def test_the_trainer_runs_on_generated_files(tmp_path: Path, dataset: str, model: str) -> None:
    data = tmp_path / "data"
    write_mnist(data, n_train=48, n_val=16) if dataset == "mnist" else write_cifar10(data)
    code, out = run_trainer(
        "--dataset",
        dataset,
        "--data-dir",
        str(data),
        "--model",
        model,
        "--total_epochs",
        "1",
        "--batch_size",
        "8",
        "--snapshot_path",
        str(tmp_path / "s.pth"),
    )
    assert code == 0 and "Epoch 1/1 completed" in out
    start = metrics(tmp_path)[0]
    assert start["dataset"] == dataset and start["train_images"] == (
        48 if dataset == "mnist" else 40
    )


def test_a_missing_dataset_exits_2(tmp_path: Path, capsys) -> None:
    code, _ = run_trainer(
        "--dataset",
        "mnist",
        "--data-dir",
        str(tmp_path),
        "--snapshot_path",
        str(tmp_path / "s.pth"),
    )
    assert code == 2 and "train-images-idx3-ubyte" in capsys.readouterr().err
