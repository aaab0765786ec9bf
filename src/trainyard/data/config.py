"""Data settings: where datasets live, how to reach S3, how hard to retry.

From the environment, over an optional ``$TRAINYARD_HOME/data.yaml`` (same keys in lower case
without the prefix, plus ``storage_options``: per-protocol fsspec options); the environment wins.
``TRAINYARD_DATASET_URL`` (default ``file://$TRAINYARD_HOME/datasets``),
``TRAINYARD_S3_ENDPOINT_URL`` (also ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``; else AWS's),
``TRAINYARD_DATA_RETRIES`` (attempts per file, 5), ``TRAINYARD_DATA_RETRY_BACKOFF_S`` (first
pause, doubled each time, 0.5), ``TRAINYARD_DATA_WORKERS`` (files at once, 8). Credentials are
never settings here: S3 takes botocore's standard ``AWS_*`` chain. docs/data.md, "Settings".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainyard.errors import ConfigError
from trainyard.pools import trainyard_home

__all__ = ["DataConfig", "load_config", "ENV_NAMES"]

ENV_NAMES = {
    "dataset_url": "TRAINYARD_DATASET_URL",
    "s3_endpoint_url": "TRAINYARD_S3_ENDPOINT_URL",
    "retries": "TRAINYARD_DATA_RETRIES",
    "retry_backoff_s": "TRAINYARD_DATA_RETRY_BACKOFF_S",
    "workers": "TRAINYARD_DATA_WORKERS",
}
"""Setting -> the environment variable that sets it."""
_KEYS = tuple(ENV_NAMES)


@dataclass(frozen=True)
class DataConfig:
    """Settings of the data layer (see the module docstring for their sources).

    Attributes:
        dataset_url: root URL of the dataset store.
        s3_endpoint_url: endpoint of an S3-compatible store, ``None`` for botocore's default.
        retries: attempts per file (1 = no retry) for transient errors.
        retry_backoff_s: pause before the second attempt; doubled each attempt, max 30 s.
        workers: files transferred at once.
        storage_options: fsspec options per protocol (``{"s3": {...}}``).
    """

    dataset_url: str
    s3_endpoint_url: str | None = None
    retries: int = 5
    retry_backoff_s: float = 0.5
    workers: int = 8
    storage_options: dict[str, dict[str, Any]] = field(default_factory=dict)


def _read_file(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read data settings: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of data settings")
    unknown = set(data) - {*_KEYS, "storage_options"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown keys {sorted(unknown)}; valid: "
            f"{', '.join((*_KEYS, 'storage_options'))}"
        )
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    values = {key: env[var] for key, var in ENV_NAMES.items() if env.get(var)}
    if "s3_endpoint_url" not in values:
        other = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
        if other:
            values["s3_endpoint_url"] = other
    return values


def _number(key: str, value: Any, kind: type, minimum: float) -> Any:
    try:
        number = kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"data setting {key}: expected a number, got {value!r}") from exc
    if number < minimum:
        raise ConfigError(f"data setting {key}: must be at least {minimum}, got {value!r}")
    return number


def load_config(env: Mapping[str, str] | None = None, path: Path | None = None) -> DataConfig:
    """The data settings now in force.

    Args:
        env: the environment to read (default ``os.environ``).
        path: the settings file (default ``$TRAINYARD_HOME/data.yaml``).

    Raises:
        ConfigError: the file is malformed or a number is not a number (names the key).
    """
    env = os.environ if env is None else env
    raw: dict[str, Any] = {**_read_file(path or trainyard_home() / "data.yaml"), **_from_env(env)}
    default_url = (trainyard_home() / "datasets").as_uri()
    return DataConfig(
        dataset_url=str(raw.get("dataset_url") or default_url),
        s3_endpoint_url=raw.get("s3_endpoint_url") or None,
        retries=_number("retries", raw.get("retries", 5), int, 1),
        retry_backoff_s=_number("retry_backoff_s", raw.get("retry_backoff_s", 0.5), float, 0),
        workers=_number("workers", raw.get("workers", 8), int, 1),
        storage_options=dict(raw.get("storage_options") or {}),
    )
