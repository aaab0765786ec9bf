"""Fixtures of the Kubernetes backend's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[Any]:
    """kmock's Kubernetes API emulator on loopback for one test (``k8s_emulator.Emulator``;
    imported here only when a test asks for it, so the manifest and dry-run tests load no
    Kubernetes client)."""
    from k8s_emulator import Emulator

    made = Emulator(tmp_path)
    yield made
    made.close()
