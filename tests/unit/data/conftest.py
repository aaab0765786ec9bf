"""Fixtures for the data layer's unit tests (file:// only; S3 lives in tests/integration/data)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``TRAINYARD_HOME``, no inherited data settings, fast retries."""
    path = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(path))
    for name in (
        "TRAINYARD_DATASET_URL",
        "TRAINYARD_S3_ENDPOINT_URL",
        "TRAINYARD_DATA_WORKERS",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINYARD_DATA_RETRIES", "3")
    monkeypatch.setenv("TRAINYARD_DATA_RETRY_BACKOFF_S", "0.01")
    return path
