"""Fixtures for the data layer's unit tests (file:// only; S3 lives in tests/integration/data)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private ``TRAINYARD_HOME``, no inherited data settings, fast retries."""
    path = tmp_path / "home"
    monkeypatch.setenv("TRAINYARD_HOME", str(path))
    for name in ("TRAINYARD_DATASET_URL", "TRAINYARD_S3_ENDPOINT_URL", "TRAINYARD_DATA_WORKERS",
                 "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINYARD_DATA_RETRIES", "3")
    monkeypatch.setenv("TRAINYARD_DATA_RETRY_BACKOFF_S", "0.01")
    return path


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``; returns ``root``."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(parents=True, exist_ok=True)
    return root


def read_tree(root: Path) -> dict[str, str]:
    """Relative path -> text of every file under ``root``."""
    return {p.relative_to(root).as_posix(): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}
