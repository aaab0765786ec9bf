"""Snapshots: the whole training state, written atomically and verified when read.

A snapshot is a ``torch.save`` file of a dict: the caller's keys plus ``format`` and
``sha256`` (a digest of every tensor and value). :func:`save_snapshot` is atomic (temporary
file, ``fsync``, ``os.replace``, folder synced). :func:`load_snapshot` loads with
``weights_only=True`` and raises ``SnapshotCorruptError`` for a truncated or foreign file, a
missing key or a digest mismatch. Same state, same bytes: no time, host, path or random id,
pickle by value (:func:`canonical`), so ``sha256sum`` compares two runs. Why each holds:
docs/training.md, "Snapshots".
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import random
import sys
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainyard.training.errors import SnapshotCorruptError, SnapshotError

__all__ = [
    "SNAPSHOT_FORMAT",
    "REQUIRED_KEYS",
    "state_digest",
    "canonical",
    "save_snapshot",
    "encode_snapshot",
    "decode_snapshot",
    "read_snapshot_bytes",
    "load_snapshot",
    "capture_rng_state",
    "restore_rng_state",
]

SNAPSHOT_FORMAT = "trainyard-snapshot/1"
REQUIRED_KEYS = ("epochs_completed", "model", "optimizer", "scheduler", "rng")
_META_KEYS = ("format", "sha256")


# ---------------------------------------------------------------------------- digest


def _feed(hasher: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        flat = obj.detach().cpu().contiguous().reshape(-1)
        hasher.update(f"T{flat.dtype}{tuple(obj.shape)}".encode())
        hasher.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        hasher.update(b"D%d" % len(obj))
        for key in sorted(obj, key=repr):
            _feed(hasher, key)
            _feed(hasher, obj[key])
    elif isinstance(obj, (list, tuple)):
        hasher.update(b"L%d" % len(obj))
        for item in obj:
            _feed(hasher, item)
    else:
        hasher.update(f"S{type(obj).__name__}:{obj!r}".encode())


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 (hex) of every key, tensor and value of ``state`` except ``format``/``sha256``.

    Lists and tuples hash alike, so a tuple that comes back as a list does not count as damage.
    """
    hasher = hashlib.sha256()
    _feed(hasher, {k: v for k, v in state.items() if k not in _META_KEYS})
    return hasher.hexdigest()


# ---------------------------------------------------------------------------- write


def canonical(obj: Any) -> Any:
    """``obj`` rebuilt so that its pickle depends on its values only, not on which objects
    happen to be shared: every ``str`` interned (equal strings become one object) and every
    ``dict``, ``OrderedDict`` (with its attributes, such as a state dict's ``_metadata``),
    ``list`` and ``tuple`` a new one. Tensors and other values are kept as they are.

    Pickle writes an object it has seen before as a back-reference, by identity: a run whose
    optimizer holds the same ``'lr'`` string as its config, and a resumed run whose optimizer
    state came from a file, would otherwise write the same state in different bytes.
    """
    kind = type(obj)
    if kind is str:
        return sys.intern(obj)
    if kind is dict or kind is OrderedDict:
        rebuilt = kind((canonical(k), canonical(v)) for k, v in obj.items())
        for name, value in vars(obj).items() if kind is OrderedDict else ():
            setattr(rebuilt, name, canonical(value))
        return rebuilt
    if kind is list or kind is tuple:
        return kind(canonical(item) for item in obj)
    return obj


def _with_meta(state: dict[str, Any]) -> dict[str, Any]:
    missing = [k for k in REQUIRED_KEYS if k not in state]
    if missing:
        raise SnapshotError(f"snapshot state lacks {', '.join(missing)}")
    return canonical({**state, "format": SNAPSHOT_FORMAT, "sha256": state_digest(state)})


def encode_snapshot(state: dict[str, Any]) -> bytes:
    """The bytes :func:`save_snapshot` would write for ``state``."""
    buffer = io.BytesIO()
    torch.save(_with_meta(state), buffer)
    return buffer.getvalue()


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems cannot open or sync a folder
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _file_mode() -> int:
    """0o666 less the process umask (read from /proc: setting umask to read it is racy)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    return 0o644


def save_snapshot(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (temp file in the same folder, fsync, replace).

    Creates the folder if needed. Idempotent for the same state.

    Raises:
        SnapshotError: ``state`` lacks a required key, or the file cannot be written (the
            previous snapshot, if any, is left untouched).
    """
    path = Path(path)
    payload = _with_meta(state)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise SnapshotError(f"cannot write snapshot {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _file_mode())  # mkstemp makes 0600 files
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        if isinstance(exc, OSError):
            raise SnapshotError(f"cannot write snapshot {path}: {exc}") from exc
        raise
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------- read


def read_snapshot_bytes(path: str | Path) -> bytes | None:
    """The raw bytes of the snapshot at ``path``, or ``None`` if there is none.

    Raises:
        SnapshotError: the path exists but cannot be read (a folder, no permission).
    """
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from exc


def decode_snapshot(data: bytes, source: str = "<bytes>") -> dict[str, Any]:
    """Load and verify snapshot bytes; tensors land on the CPU.

    Raises:
        SnapshotCorruptError: not a torch file, truncated, wrong format, a required key
            missing, or a digest mismatch. Nothing of such a file is ever returned.
    """
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for damaged files
        raise SnapshotCorruptError(
            f"{source}: not a complete snapshot ({type(exc).__name__}: {str(exc)[:200]})"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
        raise SnapshotCorruptError(f"{source}: not a {SNAPSHOT_FORMAT} file")
    missing = [k for k in (*REQUIRED_KEYS, "sha256") if k not in state]
    if missing:
        raise SnapshotCorruptError(f"{source}: snapshot lacks {', '.join(missing)}")
    if state_digest(state) != state["sha256"]:
        raise SnapshotCorruptError(f"{source}: snapshot digest mismatch (file damaged)")
    if not isinstance(state["epochs_completed"], int) or state["epochs_completed"] < 0:
        raise SnapshotCorruptError(f"{source}: bad epochs_completed {state['epochs_completed']!r}")
    return state


def load_snapshot(path: str | Path) -> dict[str, Any] | None:
    """The verified snapshot at ``path``, or ``None`` when the file does not exist.

    Raises:
        SnapshotCorruptError: the file exists but is not a complete snapshot.
        SnapshotError: the file cannot be read.
    """
    data = read_snapshot_bytes(path)
    return None if data is None else decode_snapshot(data, str(path))


# ---------------------------------------------------------------------------- RNG


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch (CPU) and CUDA generator states, as weights_only-safe values."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": name,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`capture_rng_state` captured (CUDA only if the device count matches)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["bit_generator"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
