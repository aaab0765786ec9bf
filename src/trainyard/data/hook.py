"""The runner's data hook backed by the data layer (``data.runnerhook.DataHook``).

``task:`` inputs stay plain local copies of the upstream ``{{output}}`` folder (the runner's
``FsspecData``: intermediate storage is the upstream attempt's output folder). ``url:`` and
``dataset:`` inputs, outputs and checkpoints go through ``urls``, ``DatasetStore`` and
``CheckpointWriter``, with retries and a throughput line in the task log.

OSMO semantics kept (docs, "Inputs and Outputs"): inputs land in ``{{input:N}}`` before the
command; outputs are uploaded from ``{{output}}`` (for a dataset, ``{{output}}/<path>``)
after the command succeeded, never after a failure or a cancel (the runner decides that);
``regex`` selects files by their path relative to the source folder. A dataset output named
``name:tag`` also tags the new version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from trainyard.data import urls
from trainyard.data.checkpoints import CheckpointWriter, UploadState
from trainyard.data.config import DataConfig
from trainyard.data.datasets import Actor, DatasetStore, parse_ref
from trainyard.data.runnerhook import FsspecData
from trainyard.data.transfer import Mover, file_filter, local_files
from trainyard.errors import DataError, TrainyardError
from trainyard.runfile import RunInput, RunOutput

__all__ = ["DataLayerHook"]


class DataLayerHook(FsspecData):
    """Moves a task's data; every method raises ``DataError`` on failure.

    Args:
        log: one-line messages for the task log (retries, throughput).
        config: data settings (default: the environment's).
    """

    def __init__(
        self, log: Callable[[str], None] | None = None, config: DataConfig | None = None
    ) -> None:
        self.mover = Mover(config, log)
        self.actor: Actor | None = None
        """Who datasets are read and written as (the runner sets the workflow's submitter)."""
        self._store: DatasetStore | None = None
        self._writers: dict[tuple[str, str], CheckpointWriter] = {}

    @property
    def store(self) -> DatasetStore:
        """The dataset store, opened on first use."""
        if self._store is None:
            self._store = DatasetStore(mover=self.mover, actor=self.actor)
        return self._store

    def download(self, item: RunInput, dest: Path) -> int:
        """Fetch ``item`` into ``dest``; returns the number of files."""
        if item.kind == "task":
            return super().download(item, dest)
        dest.mkdir(parents=True, exist_ok=True)
        if item.kind == "url":
            return urls.download(item.source, dest, item.regex, self.mover, missing_ok=True)
        with _as_data_error(f"dataset {item.source}"):
            version, stats = self.store.download(item.source, dest, item.path, item.regex)
        self.mover.log(f"dataset {version.name} version {version.version}: {stats.files} file(s)")
        return stats.files

    def upload(self, src: Path, target: RunOutput) -> int:
        """Upload the output folder ``src`` to ``target``; returns the number of files."""
        if target.url is not None:
            files = local_files(src, file_filter(target.regex), confined=True, log=self.mover.log)
            return self.mover.upload_files(files, self.mover.location(target.url)).files
        assert target.dataset is not None  # RunOutput guarantees one target
        name, selector = parse_ref(target.dataset.name)
        root = src / (target.dataset.path or "").strip("/")
        files = local_files(
            root,
            file_filter(target.regex or target.dataset.regex),
            confined=True,
            log=self.mover.log,
        )
        tag = None if selector == "latest" or target.dataset.name == name else selector
        with _as_data_error(f"dataset {name}"):
            return len(self.store.upload(name, files, tag).files)

    def sync(self, src: Path, url: str, regex: str | None, state: UploadState) -> int:
        """One checkpoint round of ``src`` to ``url`` (``checkpoints`` module rule)."""
        key = (str(src), url)
        if key not in self._writers:
            self._writers[key] = CheckpointWriter(url, self.mover)
        return self._writers[key].upload_round(src, regex, state)


class _as_data_error:
    """Turn a trainyard error other than DataError (e.g. NotFoundError) into a DataError, so
    the runner reports it as a data failure (2010/2012)."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if isinstance(exc, TrainyardError) and not isinstance(exc, DataError):
            raise DataError(f"{self.what}: {exc}") from exc
