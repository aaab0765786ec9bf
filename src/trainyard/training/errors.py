"""Errors of the training kit, one class per failure (the kit imports nothing else of
trainyard, so it keeps its own hierarchy rather than ``trainyard.errors``)::

    TrainingKitError
    ├── DatasetError            a dataset is missing, unreadable or malformed
    ├── SnapshotError           a snapshot cannot be written or read; SnapshotCorruptError (not
    │                           a complete snapshot), SnapshotMismatchError (another model's)
    ├── DistributedSetupError   torchrun's environment is inconsistent
    ├── InjectedFailure         ``--fail-at-epoch`` fired (tests and reschedule demos)
    └── BarrierError            the barrier could not release its ranks; BarrierFailed (bad
                                rank, a peer failed), BarrierTimeout (not every rank came)
"""

from __future__ import annotations

__all__ = [
    "TrainingKitError",
    "DatasetError",
    "SnapshotError",
    "SnapshotCorruptError",
    "SnapshotMismatchError",
    "DistributedSetupError",
    "InjectedFailure",
    "BarrierError",
    "BarrierFailed",
    "BarrierTimeout",
]


class TrainingKitError(Exception):
    """Base class of every error the training kit raises on purpose."""


class DatasetError(TrainingKitError):
    """A dataset is missing, unreadable or malformed; the message names the file."""


class SnapshotError(TrainingKitError):
    """A snapshot could not be written or read."""


class SnapshotCorruptError(SnapshotError):
    """A snapshot file exists but is not a complete, valid snapshot (never loaded)."""


class SnapshotMismatchError(SnapshotError):
    """A sound snapshot that does not fit the model, optimizer or scheduler of this run."""


class DistributedSetupError(TrainingKitError):
    """The distributed environment (RANK, WORLD_SIZE, ...) is missing or inconsistent."""


class InjectedFailure(TrainingKitError):
    """The failure asked for with ``--fail-at-epoch`` (a test hook, fired once)."""


class BarrierError(TrainingKitError):
    """The barrier tool did not release its ranks."""


class BarrierFailed(BarrierError):
    """A duplicate or out-of-range rank connected, or rank 0 reported a failure."""


class BarrierTimeout(BarrierError):
    """Not every rank arrived before the timeout."""
