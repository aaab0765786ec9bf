"""The Slurm backend: each gang is one Slurm job, each task one ``srun`` step running the
task runner. ``backend.py`` holds the ``Backend`` hooks; ``script.py`` the job's shape,
``jobfiles.py`` its files, ``attempts.py`` the attempts' records, ``watch.py`` the facts,
``cancelling.py`` stopping, ``states.py`` the state table, ``options.py`` the pool options
(docs/pools.md, "Module: `src/trainyard/backends/slurm/backend.py`").

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
