"""trainyard: run NVIDIA OSMO workflow specs for multi-node training on this machine,
on Slurm, or on Kubernetes."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
