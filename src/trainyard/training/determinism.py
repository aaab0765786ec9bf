"""What makes a training run reproducible: seeding every generator, GPU determinism, and the
record a snapshot and ``metrics.jsonl`` keep of both.

Two runs of the trainer with the same flags, the same data, the same world size and the same
torch build end with bit-identical weights on CPUs (gloo) whichever backend started them (the
local pool, Slurm, Kubernetes): every random draw comes from ``--seed`` (weights, data order,
dropout; Python's ``random`` and numpy's global generator too, so that the RNG states a
snapshot keeps are the same as well), and gloo's all-reduce adds in a fixed order once DDP's
buckets are settled (``Trainer.settle_buckets``).

On GPUs that is not enough: cuBLAS picks reduction strategies per stream, cuDNN benchmarks
and picks convolution algorithms by timing, and some CUDA kernels (``index_add_``,
``scatter_add_``, the backward of ``gather``/embedding bags) accumulate with atomics in an
order that changes from run to run. ``--deterministic`` (:func:`enable_deterministic`) turns
all of that off:

- ``torch.use_deterministic_algorithms(True)``: deterministic kernels where torch has them; an
  op without one raises ``RuntimeError`` rather than silently differ;
- ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (set before CUDA starts, unless the user set it): a fixed
  cuBLAS workspace per stream, as CUDA >= 10.2 needs for deterministic GEMMs;
- ``torch.backends.cudnn.deterministic = True`` and ``benchmark = False``: the same cuDNN
  algorithm every run, not the fastest one timed at start.

Cost (docs/reproducible.md): GPU steps get slower where a nondeterministic kernel was the fast
one (cuDNN convolutions no longer picked by timing, scatter/index reductions without atomics;
PyTorch's docs say only "often slower", by how much depends on the model), cuBLAS holds
8 buffers of 4 MiB of workspace per stream (about 24 MiB more than its default), and a model using
an op without a deterministic
kernel fails at that op. On CPUs the flag changes nothing in the results (the CPU kernels the
trainer uses are already deterministic); it is recorded all the same.

Source: PyTorch docs, "Reproducibility" (notes/randomness) and
``torch.use_deterministic_algorithms``; NVIDIA cuBLAS docs, "Results reproducibility".
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
