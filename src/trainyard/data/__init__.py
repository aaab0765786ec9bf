"""The data layer: URLs and datasets through fsspec (``file://`` by default, ``s3://`` and
anything else fsspec knows by URL). See ../shared/DESIGN.md.

Modules:
    config       settings (``TRAINYARD_DATASET_URL``, ``TRAINYARD_S3_ENDPOINT_URL``, ...)
    storage      URL -> fsspec filesystem; atomic put/get, exclusive create, listings
    transfer     ``Mover``: parallel, retried, logged file transfers; regex selection
    urls         upload / download / list a URL
    datasets     ``DatasetStore``: named datasets, numbered versions, tags, manifests
    checkpoints  checkpoint rounds that readers see whole or not at all
    hook         the task runner's data hook (``runner_hook``)
    scrub        credentials out of every message
    testing      a loopback S3 server (moto) for tests
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainyard.data.config import DataConfig, load_config
from trainyard.data.datasets import DatasetInfo, DatasetStore, DatasetVersion, parse_ref
from trainyard.data.scrub import scrub
from trainyard.data.transfer import Mover, TransferStats
from trainyard.data.urls import download, list_url, upload

if TYPE_CHECKING:
    from trainyard.data.hook import DataLayerHook

__all__ = [
    "DataConfig", "load_config", "DatasetInfo", "DatasetStore", "DatasetVersion", "parse_ref",
    "Mover", "TransferStats", "download", "list_url", "upload", "scrub", "runner_hook",
]


def runner_hook(log: Callable[[str], None] | None = None) -> DataLayerHook:
    """The runner's data hook (``runner.data.load_data_hook`` calls this).

    Args:
        log: the task log's writer for retries and throughput lines.
    """
    from trainyard.data.hook import DataLayerHook

    return DataLayerHook(log)
