"""The Slurm backend: each gang is one Slurm job, each task one ``srun`` step running the
task runner (see ``backend.py`` for the lifecycle, ``script.py`` for the job's shape,
``states.py`` for the state table, ``options.py`` for the pool options).

The registry (``trainyard.backends.BACKENDS``) names ``trainyard.backends.slurm:create``.
"""

from __future__ import annotations

from trainyard.backends.slurm.backend import SlurmBackend, create
from trainyard.backends.slurm.options import SlurmOptions, parse_options
from trainyard.backends.slurm.script import SlurmBatchRequest, SrunStep, build_request
from trainyard.backends.slurm.states import SLURM_STATES, fact_for_state

__all__ = [
    "SlurmBackend",
    "create",
    "SlurmOptions",
    "parse_options",
    "SlurmBatchRequest",
    "SrunStep",
    "build_request",
    "SLURM_STATES",
    "fact_for_state",
]
