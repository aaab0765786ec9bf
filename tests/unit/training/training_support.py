"""Helpers for the training kit's unit tests: small datasets in the real file formats, free
ports, and running the trainer in-process (a world of one)."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainyard.training.data import write_idx
from trainyard.training.train import main as train_main

__all__ = ["free_port", "run_trainer", "metrics", "write_mnist", "write_cifar10", "load_weights"]


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_trainer(*argv: str) -> tuple[int, str]:
    """Run ``python -m trainyard.training.train ARGV`` in this process; (exit code, stdout)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_main(list(argv))
    return code, out.getvalue()


def metrics(folder: Path) -> list[dict[str, Any]]:
    """The records of ``folder/metrics.jsonl``."""
    path = Path(folder) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def load_weights(snapshot: Path) -> dict[str, torch.Tensor]:
    return torch.load(snapshot, weights_only=True)["model"]


def write_mnist(
    folder: Path, n_train: int = 64, n_val: int = 32, gz: bool = False, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write the four MNIST IDX files (28x28 uint8 images, labels 0..9) into ``folder``."""
    rng = np.random.RandomState(seed)
    arrays = {
        "train-images-idx3-ubyte": rng.randint(0, 256, (n_train, 28, 28)).astype(np.uint8),
        "train-labels-idx1-ubyte": (np.arange(n_train) % 10).astype(np.uint8),
        "t10k-images-idx3-ubyte": rng.randint(0, 256, (n_val, 28, 28)).astype(np.uint8),
        "t10k-labels-idx1-ubyte": (np.arange(n_val) % 10)[::-1].astype(np.uint8),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        write_idx(folder / (name + (".gz" if gz else "")), array)
    return arrays


def write_cifar10(
    folder: Path, per_batch: int = 8, n_test: int = 10, seed: int = 0
) -> dict[str, Any]:
    """Write CIFAR-10's python batches (``data_batch_1..5``, ``test_batch``) as the original
    files are laid out: pickled dicts with bytes keys, ``data`` (N, 3072) uint8, ``labels``."""
    rng = np.random.RandomState(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        n = n_test if name == "test_batch" else per_batch
        batch = {
            b"batch_label": name.encode(),
            b"labels": [int(v) for v in rng.randint(0, 10, n)],
            b"data": rng.randint(0, 256, (n, 3072)).astype(np.uint8),
            b"filenames": [f"img{i}.png".encode() for i in range(n)],
        }
        with (folder / name).open("wb") as handle:
            pickle.dump(batch, handle, protocol=2)
        written[name] = batch
    return written
