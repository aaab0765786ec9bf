"""A real PostgreSQL server for the store and engine tests, and a fresh database per test.

Where the server comes from, in order:
1. ``$TRAINYARD_TEST_POSTGRES_URL``: an admin URL (SQLAlchemy form, e.g.
   ``postgresql+psycopg://postgres@/postgres?host=/tmp/trainyard-postgres``) that may create
   and drop databases. ``.ci/run`` starts one with ``scripts/postgres-cluster.sh`` and sets
   it, so CI always runs these tests; a URL that is set but unreachable FAILS them (it never
   turns into a skip).
2. Otherwise a throwaway server of this test session, started with
   ``scripts/postgres-cluster.sh`` in a temporary folder and stopped at the session's end.
3. Otherwise (no psycopg, no PostgreSQL binaries) the PostgreSQL half of each test is
   skipped, saying which of the two is missing.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "postgres-cluster.sh"
URL_ENV = "TRAINYARD_TEST_POSTGRES_URL"

__all__ = ["SCRIPT", "URL_ENV", "fresh_database", "server_url"]


def _psycopg_missing() -> str | None:
    """Why psycopg cannot be used here, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        return f"psycopg is not installed (pip install 'trainyard[postgres]'): {exc}"
    return None


def server_url() -> Iterator[str]:
    """Yield an admin URL of a running PostgreSQL server (see the module's docstring); skip
    (saying why) when none can be had and none was named."""
    named = os.environ.get(URL_ENV)
    if named:
        yield named
        return
    missing = _psycopg_missing()
    if missing:
        pytest.skip(missing)
    folder = tempfile.mkdtemp(prefix="trainyard-pg.")
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", folder], capture_output=True, text=True, timeout=120
    )
    if started.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop", folder], capture_output=True, timeout=60)
        pytest.skip(
            f"no PostgreSQL server could be started here ({URL_ENV} is not set): "
            f"{started.stderr.strip()[-300:]}"
        )
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", folder], capture_output=True, timeout=60)


def fresh_database(admin: str, prefix: str = "ty_test") -> Iterator[str]:
    """Yield the URL of a new, empty database on the server of ``admin``; drop it (and end
    its connections) afterwards."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield make_url(admin).set(database=name).render_as_string(hide_password=False)
        finally:
            with engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()
