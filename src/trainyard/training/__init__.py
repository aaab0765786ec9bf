"""Training kit that runs inside tasks. Imports nothing else of trainyard; the package itself
imports nothing either, so the barrier and the launcher start without loading torch.

Modules: ``train`` (the DDP trainer; ``main(argv)`` returns the exit code), ``snapshot``
(atomic, verified snapshots), ``determinism`` (seeding, ``--deterministic``, the record),
``data`` (digits, MNIST, CIFAR-10), ``models`` (small MLP and CNN), ``dist`` (torchrun's
environment, process group, node layout), ``report`` (console lines, ``metrics.jsonl``),
``barrier`` (OSMO's start barrier), ``launch`` (one process per slot without torchrun),
``errors`` (the kit's error hierarchy). docs/training.md.
"""

__all__: list[str] = []
