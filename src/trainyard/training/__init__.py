"""Training kit that runs inside tasks. Imports nothing else of trainyard.

Modules (import the one you need; the package itself imports nothing, so the barrier and
the launcher start without loading torch):

- :mod:`~trainyard.training.train`: the DDP trainer, ``python -m trainyard.training.train``
  or ``torchrun ... -m trainyard.training.train``; ``main(argv)`` returns the exit code.
- :mod:`~trainyard.training.snapshot`: atomic, verified snapshots (the same bytes for the same state).
- :mod:`~trainyard.training.determinism`: seeding, ``--deterministic`` for GPUs, and the
  reproducibility record of snapshots and metrics.
- :mod:`~trainyard.training.data`: digits (bundled), MNIST (IDX) and CIFAR-10 (python batches).
- :mod:`~trainyard.training.models`: small MLP and CNN classifiers.
- :mod:`~trainyard.training.dist`: torchrun's environment, process group, node layout.
- :mod:`~trainyard.training.report`: the Slurm seed's report lines and ``metrics.jsonl``.
- :mod:`~trainyard.training.barrier`: OSMO's start barrier, ``python -m trainyard.training.barrier``.
- :mod:`~trainyard.training.launch`: one process per slot without torchrun.
- :mod:`~trainyard.training.errors`: the kit's error hierarchy.
"""

__all__: list[str] = []
