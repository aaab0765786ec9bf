"""Fixtures for the spec tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def weird_tmp_path(tmp_path: Path) -> Path:
    """A folder whose path has spaces, quotes and non-ASCII letters."""
    path = tmp_path / "spec dir 'quoted' \"double\" é"
    path.mkdir()
    return path
