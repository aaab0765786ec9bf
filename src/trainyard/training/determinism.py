"""What makes a training run reproducible: seeding every generator, GPU determinism, and the
record a snapshot and ``metrics.jsonl`` keep of both.

Same flags, data, world size and torch build give bit-identical weights on CPUs (gloo) on any
backend: every random draw comes from ``--seed`` and gloo's all-reduce adds in a fixed order
once DDP's buckets are settled (``Trainer.settle_buckets``). On GPUs ``--deterministic``
(:func:`enable_deterministic`) also sets ``torch.use_deterministic_algorithms(True)`` (an op
without a deterministic kernel raises ``RuntimeError``), ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
unless set, and cuDNN ``deterministic``/no ``benchmark``. Source: PyTorch docs,
"Reproducibility"; NVIDIA cuBLAS docs, "Results reproducibility". Why and what it costs:
docs/reproducible.md, "Determinism on GPUs".
"""

from __future__ import annotations

import os
import random
from collections.abc import MutableMapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

__all__ = [
    "CUBLAS_WORKSPACE",
    "torch_version",
    "Reproducibility",
    "seed_everything",
    "enable_deterministic",
    "deterministic_mode",
]

CUBLAS_WORKSPACE = ":4096:8"
"""The ``CUBLAS_WORKSPACE_CONFIG`` value ``--deterministic`` sets (cuBLAS docs: ``:4096:8``
or ``:16:8``; the first costs more memory, the second more speed)."""


@dataclass(frozen=True)
class Reproducibility:
    """What two runs must share to end with the same weights, as recorded in a snapshot's
    ``reproducibility`` key and in ``metrics.jsonl``'s ``start`` and ``summary`` lines.

    Attributes:
        seed: ``--seed``.
        world_size: number of training processes (the data each one sees depends on it).
        torch_version: ``torch.__version__`` (kernels change between releases).
        deterministic: whether ``--deterministic`` was on.
        backend: the process group's backend (``gloo`` or ``nccl``).
        device_type: ``cpu`` or ``cuda``.
    """

    seed: int
    world_size: int
    torch_version: str
    deterministic: bool
    backend: str
    device_type: str

    def to_json(self) -> dict[str, Any]:
        """The record as plain values (a snapshot stores it as they are, weights_only-safe)."""
        return asdict(self)


def torch_version() -> str:
    """``torch.__version__`` as a plain ``str`` (its own class, ``TorchVersion``, is no
    weights_only-safe value: a snapshot holding it could not be read back)."""
    return str(torch.__version__)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, numpy's global generator and torch's (CPU and every GPU).

    The trainer draws nothing from ``random`` or numpy, but a snapshot keeps their states; left
    unseeded (the interpreter seeds them from the OS) two identical runs would write snapshots
    that differ in those bytes only.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def enable_deterministic(environ: MutableMapping[str, str] | None = None) -> None:
    """Make GPU training deterministic (module docstring); call before CUDA is first used.

    Sets ``CUBLAS_WORKSPACE_CONFIG`` in ``environ`` (default ``os.environ``) unless it is set
    already, turns on ``torch.use_deterministic_algorithms`` and fixes cuDNN's algorithm
    choice. Idempotent. Ops without a deterministic kernel then raise ``RuntimeError``.
    """
    target = os.environ if environ is None else environ
    target.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def deterministic_mode() -> bool:
    """Whether torch runs with deterministic algorithms now (``--deterministic`` or a caller's
    own ``torch.use_deterministic_algorithms(True)``)."""
    return bool(torch.are_deterministic_algorithms_enabled())
