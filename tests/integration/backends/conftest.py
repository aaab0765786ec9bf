"""Fixtures for local backend tests: a backend per isolation mode, under tmp_path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_support import isolation_available

from trainyard.backends.local import LocalBackend

MODES = {
    "sandboxed": ("bwrap", "netns"),
    "fallback": ("none", "loopback"),
}


@pytest.fixture(autouse=True)
def server_umask() -> Iterator[None]:
    """The server's umask (077, ``trainyard.server.__main__``), which the launcher a test's
    backend starts inherits: a file the task must read has to say so itself."""
    before = os.umask(0o077)
    yield
    os.umask(before)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def _backend(home: Path, mode: str) -> LocalBackend:
    sandbox, network = MODES[mode]
    why_not = isolation_available(sandbox, network)
    if why_not:
        pytest.skip(f"{mode} isolation not available here: {why_not}")
    return LocalBackend(home=home, sandbox=sandbox, network=network, stop_grace_s=2.0)


@pytest.fixture(params=list(MODES))
def backend(request: pytest.FixtureRequest, home: Path) -> Iterator[LocalBackend]:
    """A local backend in each isolation mode (sandboxed: bwrap + netns; fallback: none)."""
    made = _backend(home, request.param)
    yield made
    made.stop(list(made._attempts))


@pytest.fixture
def sandboxed(home: Path) -> Iterator[LocalBackend]:
    """A local backend with bubblewrap and group network namespaces (skips without)."""
    made = _backend(home, "sandboxed")
    yield made
    made.stop(list(made._attempts))
