"""Whether two saved models are the same model: tensor by tensor, not byte by byte.

Two snapshots may hold the same weights in different bytes (another optimizer state, another
record of the run, another torch version's file layout), and a checksum would call them
different. :func:`compare_models` loads both files (``torch.load`` with ``weights_only=True``,
memory-mapped, so a file from a task cannot run code here and a large one is not read whole),
takes each one's model (the ``model`` key of a trainyard snapshot or any dict holding one,
else the file's own dict of tensors) and compares every tensor with ``torch.equal`` (same
dtype, shape and values) under the same name.

torch is imported on first use: the server starts without it, and where it is not installed
the answer says so (``identical`` is ``None``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ModelComparison", "compare_models", "same_bytes", "MAX_NAMES"]

MAX_NAMES = 20
"""Tensor names listed per kind of difference (the count is always whole)."""


@dataclass(frozen=True)
class ModelComparison:
    """The answer of :func:`compare_models`.

    Attributes:
        identical: True when both models have the same tensor names and every tensor is
            ``torch.equal``; False otherwise; None when it could not be decided (``error``).
        tensors: tensors compared (names in both).
        differing: names whose tensors differ (dtype, shape or a value), at most ``MAX_NAMES``.
        differing_count: how many differ in all.
        only_in_a, only_in_b: names in one model only, at most ``MAX_NAMES`` each.
        same_bytes: whether the two files are byte-identical.
        error: why ``identical`` is None.
    """

    identical: bool | None
    tensors: int = 0
    differing: list[str] = field(default_factory=list)
    differing_count: int = 0
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)
    same_bytes: bool | None = None
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def same_bytes(path_a: Path, path_b: Path, piece_bytes: int = 1 << 20) -> bool:
    """Whether two files hold the same bytes: sizes first, then piece by piece, stopping at
    the first piece that differs (two large models that differ are not read whole)."""
    if path_a.stat().st_size != path_b.stat().st_size:
        return False
    with path_a.open("rb") as a, path_b.open("rb") as b:
        while True:
            piece = a.read(piece_bytes)
            if piece != b.read(piece_bytes):
                return False
            if not piece:
                return True


def _flatten(obj: Any, prefix: str, out: dict[str, Any], torch: Any) -> None:
    """Every tensor of nested dicts under dotted names (``layer.weight``, ``a.b.c``)."""
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out, torch)


def _model_of(loaded: Any) -> Any:
    """The model part of a loaded file: its ``model`` entry when it has one, else itself."""
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        return loaded["model"]
    return loaded


def _load_tensors(path: Path, torch: Any) -> dict[str, Any]:
    loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    tensors: dict[str, Any] = {}
    _flatten(_model_of(loaded), "", tensors, torch)
    return tensors


def _equal(a: Any, b: Any, torch: Any) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))


def _compare_tensors(a: dict[str, Any], b: dict[str, Any], torch: Any) -> ModelComparison:
    common = [name for name in a if name in b]
    differing = [name for name in common if not _equal(a[name], b[name], torch)]
    only_a = [name for name in a if name not in b]
    only_b = [name for name in b if name not in a]
    identical = bool(common) and not differing and not only_a and not only_b
    return ModelComparison(
        identical,
        len(common),
        differing[:MAX_NAMES],
        len(differing),
        only_a[:MAX_NAMES],
        only_b[:MAX_NAMES],
    )


def compare_models(path_a: Path, path_b: Path) -> ModelComparison:
    """Compare the models saved at ``path_a`` and ``path_b`` (module docstring).

    Never raises for a bad file: a file that torch cannot load safely, or no torch, gives
    ``identical=None`` and the reason. Files without a single tensor are not "identical".
    """
    identical_bytes = same_bytes(path_a, path_b)
    try:
        import torch
    except ImportError:
        return ModelComparison(
            None, same_bytes=identical_bytes, error="torch is not installed where the server runs"
        )
    try:
        tensors_a, tensors_b = _load_tensors(path_a, torch), _load_tensors(path_b, torch)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a file it refuses
        return ModelComparison(
            None,
            same_bytes=identical_bytes,
            error=f"cannot load as a model: {type(exc).__name__}: {str(exc)[:200]}",
        )
    result = _compare_tensors(tensors_a, tensors_b, torch)
    return ModelComparison(**{**asdict(result), "same_bytes": identical_bytes})
