"""Fixtures shared by every test folder.

``store_url``: the URL of an empty store, once on SQLite and once on a real PostgreSQL
server (``tests/support/pg_support.py`` says where that server comes from). A store or engine
test that takes it runs on both; its PostgreSQL half is skipped, saying why, only where no
PostgreSQL server can be had.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pg_support import fresh_database, server_url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The admin URL of a running PostgreSQL server, for the whole session."""
    yield from server_url()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store's URL: ``sqlite:///<tmp>/db.sqlite``, or a fresh PostgreSQL database
    (dropped after the test)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db.sqlite'}"
        return
    admin = request.getfixturevalue("postgres_server")
    yield from fresh_database(admin)
