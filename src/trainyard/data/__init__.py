"""The data layer: URLs and datasets through fsspec (``file://`` by default, ``s3://`` and
anything else fsspec knows by URL). See ../shared/DESIGN.md and docs/data.md.

Modules: ``config`` (settings), ``storage`` (URL -> fsspec; atomic put/get, exclusive create,
listings), ``transfer`` (``Mover``: parallel, retried, logged transfers), ``localcopy``
(hashed local copies), ``urls`` (upload/download/list), ``datasets`` (``DatasetStore``:
versions, tags, manifests), ``checkpoints`` (whole rounds), ``runnerhook`` and ``hook`` (the
runner's ``DataHook``), ``scrub`` (credentials out of messages), ``testing`` (moto S3).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainyard.data.config import DataConfig, load_config
    from trainyard.data.datasets import DatasetInfo, DatasetStore, DatasetVersion, parse_ref
    from trainyard.data.hook import DataLayerHook
    from trainyard.data.transfer import Mover, TransferStats
    from trainyard.data.urls import download, list_url, upload

__all__ = [
    "DataConfig",
    "load_config",
    "DatasetInfo",
    "DatasetStore",
    "DatasetVersion",
    "parse_ref",
    "Mover",
    "TransferStats",
    "download",
    "list_url",
    "upload",
    "runner_hook",
]

_HOMES = {
    "DataConfig": "config",
    "load_config": "config",
    "DatasetInfo": "datasets",
    "DatasetStore": "datasets",
    "DatasetVersion": "datasets",
    "parse_ref": "datasets",
    "Mover": "transfer",
    "TransferStats": "transfer",
    "download": "urls",
    "list_url": "urls",
    "upload": "urls",
}
"""Public name -> its module. Imported on first use, so that ``trainyard.data.scrub`` (which
the task runner imports at start) does not pull in fsspec, pydantic models and rich."""


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'trainyard.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trainyard.data.{_HOMES[name]}"), name)


def runner_hook(log: Callable[[str], None] | None = None) -> DataLayerHook:
    """The runner's data hook (``data.runnerhook.load_data_hook`` calls this).

    Args:
        log: the task log's writer for retries and throughput lines.
    """
    from trainyard.data.hook import DataLayerHook

    return DataLayerHook(log)
