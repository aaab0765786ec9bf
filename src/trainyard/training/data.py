"""Datasets the trainer reads, all from local files (nothing is downloaded).

``digits``: scikit-learn's bundled 8x8 digits (1,797 images), split by a fixed permutation
into 1,437 training and 360 validation images. ``mnist``: the four IDX files (plain or
``.gz``) in ``--data-dir`` or its ``MNIST/raw``; the 10,000 test images validate.
``cifar10``: the "python version" batches in ``--data-dir`` or its ``cifar-10-batches-py``,
read with an unpickler that accepts only the numpy names they use (a hostile file cannot run
code). Every loader returns :class:`DatasetSplits`: float32 NCHW images standardised with the
training set's mean and deviation, int64 labels. Sources: Y. LeCun, "THE MNIST DATABASE";
A. Krizhevsky, "The CIFAR-10 dataset"; scikit-learn ``load_digits``.
"""

from __future__ import annotations

import gzip
import importlib.util
import pickle
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainyard.training.errors import DatasetError

__all__ = [
    "DATASETS",
    "DatasetSplits",
    "load_dataset",
    "load_digits",
    "load_mnist",
    "load_cifar10",
    "read_idx",
    "write_idx",
]

DIGITS_VALIDATION_SIZE = 360
DIGITS_SPLIT_SEED = 0
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "val_images": "t10k-images-idx3-ubyte",
    "val_labels": "t10k-labels-idx1-ubyte",
}
CIFAR10_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_BATCH = "test_batch"

# IDX type codes -> numpy big-endian dtypes (LeCun, "THE MNIST DATABASE", file formats).
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


@dataclass(frozen=True)
class DatasetSplits:
    """A dataset split into training and validation arrays.

    Attributes:
        name: ``digits``, ``mnist`` or ``cifar10``.
        train_x, val_x: float32 arrays of shape (N, C, H, W), standardised.
        train_y, val_y: int64 arrays of shape (N,), class indices in [0, num_classes).
        num_classes: number of classes (10 for every bundled dataset).
    """

    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(channels, height, width) of one image."""
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]


def _standardise(train: np.ndarray, val: np.ndarray, scale: float) -> tuple[np.ndarray, np.ndarray]:
    train = train.astype(np.float32) / scale
    val = val.astype(np.float32) / scale
    mean, std = float(train.mean()), float(train.std()) or 1.0
    return (train - mean) / std, (val - mean) / std


def _splits(name: str, train_x, train_y, val_x, val_y, scale: float) -> DatasetSplits:
    train_x, val_x = _standardise(train_x, val_x, scale)
    return DatasetSplits(
        name=name,
        train_x=np.ascontiguousarray(train_x),
        train_y=np.asarray(train_y, dtype=np.int64),
        val_x=np.ascontiguousarray(val_x),
        val_y=np.asarray(val_y, dtype=np.int64),
        num_classes=10,
    )


# ---------------------------------------------------------------------------- digits


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as (images (1797, 8, 8) in 0..16, labels (1797,)).

    Reads the CSV that scikit-learn ships without importing ``sklearn.datasets`` (which
    costs a second or more of start-up in every training process); falls back to
    ``load_digits`` if the file is not where scikit-learn keeps it.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        csv = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            table = np.loadtxt(csv, delimiter=",")
            return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError as exc:  # pragma: no cover - scikit-learn is a dependency of [train]
        raise DatasetError(
            "the digits dataset needs scikit-learn (pip install scikit-learn)"
        ) from exc
    bunch = sk_load_digits()
    return bunch.images, bunch.target.astype(np.int64)


def load_digits(data_dir: str | Path | None = None) -> DatasetSplits:
    """The bundled digits, split 1,437 / 360 by a fixed permutation (seed 0).

    ``data_dir`` is ignored: the data ships with scikit-learn.
    """
    images, labels = _digits_arrays()
    order = np.random.RandomState(DIGITS_SPLIT_SEED).permutation(len(labels))
    val, train = order[:DIGITS_VALIDATION_SIZE], order[DIGITS_VALIDATION_SIZE:]
    images = images[:, None, :, :]
    return _splits("digits", images[train], labels[train], images[val], labels[val], 16.0)


# ---------------------------------------------------------------------------- MNIST (IDX)


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array.

    Raises:
        DatasetError: the file is missing, has a bad magic number or is truncated.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as exc:
        raise DatasetError(f"{path}: cannot read IDX file: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DatasetError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: IDX header truncated")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path}: IDX body has {len(raw) - header} bytes, dimensions {dims} need {expected}"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))
    )


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (``.gz`` suffix: compressed). Used to make test data."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    code = codes.get(array.dtype)
    if code is None:
        raise ValueError(f"IDX cannot hold dtype {array.dtype}")
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = array.astype(np.dtype(_IDX_DTYPES[code])).tobytes()
    data = header + body
    Path(path).write_bytes(gzip.compress(data) if str(path).endswith(".gz") else data)


def _find_file(folders: list[Path], stem: str) -> Path:
    for folder in folders:
        for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
            if (folder / name).is_file():
                return folder / name
    searched = ", ".join(str(f) for f in folders)
    raise DatasetError(f"{stem}(.gz) not found in {searched}")


def load_mnist(data_dir: str | Path) -> DatasetSplits:
    """MNIST from its IDX files in ``data_dir`` (or ``data_dir/MNIST/raw``).

    Raises:
        DatasetError: a file is missing or malformed, or images and labels disagree.
    """
    root = Path(data_dir)
    folders = [root, root / "MNIST" / "raw", root / "raw"]
    arrays = {key: read_idx(_find_file(folders, stem)) for key, stem in MNIST_FILES.items()}
    for part in ("train", "val"):
        images, labels = arrays[f"{part}_images"], arrays[f"{part}_labels"]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise DatasetError(
                f"MNIST {part}: images {images.shape} and labels {labels.shape} do not match"
            )
        _check_labels(f"MNIST {part}", labels)
    return _splits(
        "mnist",
        arrays["train_images"][:, None],
        arrays["train_labels"],
        arrays["val_images"][:, None],
        arrays["val_labels"],
        255.0,
    )


# ---------------------------------------------------------------------------- CIFAR-10


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles CIFAR-10 batches: dicts, lists, bytes, numbers and numpy arrays only."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with path.open("rb") as handle:
            batch = _NumpyOnlyUnpickler(handle, encoding="bytes").load()
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError) as exc:
        raise DatasetError(f"{path}: not a CIFAR-10 python batch: {exc}") from exc
    if not isinstance(batch, dict):
        raise DatasetError(f"{path}: not a CIFAR-10 python batch (a {type(batch).__name__})")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DatasetError(f"{path}: CIFAR-10 batch lacks 'data' or 'labels'")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch["labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise DatasetError(
            f"{path}: data {data.shape} / labels {labels.shape}: expected (N, 3072) and (N,)"
        )
    _check_labels(str(path), labels)
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(data_dir: str | Path) -> DatasetSplits:
    """CIFAR-10 from its python batches in ``data_dir`` (or ``data_dir/cifar-10-batches-py``).

    Raises:
        DatasetError: a batch is missing or malformed.
    """
    root = Path(data_dir)
    folder = root / "cifar-10-batches-py" if (root / "cifar-10-batches-py").is_dir() else root
    missing = [
        n for n in (*CIFAR10_TRAIN_BATCHES, CIFAR10_TEST_BATCH) if not (folder / n).is_file()
    ]
    if missing:
        raise DatasetError(f"CIFAR-10 batches missing in {folder}: {', '.join(missing)}")
    train = [_read_cifar_batch(folder / n) for n in CIFAR10_TRAIN_BATCHES]
    val_x, val_y = _read_cifar_batch(folder / CIFAR10_TEST_BATCH)
    train_x = np.concatenate([x for x, _ in train])
    train_y = np.concatenate([y for _, y in train])
    return _splits("cifar10", train_x, train_y, val_x, val_y, 255.0)


def _check_labels(where: str, labels: np.ndarray) -> None:
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DatasetError(f"{where}: labels must lie in 0..9, got {labels.min()}..{labels.max()}")


DATASETS: dict[str, Callable[..., DatasetSplits]] = {
    "digits": load_digits,
    "mnist": load_mnist,
    "cifar10": load_cifar10,
}


def load_dataset(name: str, data_dir: str | Path | None = None) -> DatasetSplits:
    """Load dataset ``name`` (one of :data:`DATASETS`).

    Raises:
        DatasetError: unknown name, ``data_dir`` missing for mnist/cifar10, or bad files.
    """
    if name not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    if name != "digits":
        if data_dir is None:
            raise DatasetError(f"--dataset {name} needs --data-dir pointing at a local copy")
        if not Path(data_dir).is_dir():
            raise DatasetError(f"--data-dir {data_dir} is not a folder")
    return DATASETS[name](data_dir)
