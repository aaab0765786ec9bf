"""The team server on PostgreSQL (issue 26): with ``TRAINYARD_DATABASE_URL`` naming a fresh,
empty database, the real CLI starts a real server that creates its schema there and runs a
workflow to its end (a gang whose worker reaches its lead by ``{{host:...}}``, then a task
that reads its output); a second server on the same database, from another home, is refused
by the store's advisory lock and names the holder."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from pg_support import fresh_database
from sqlalchemy import create_engine, text

BIN = Path(sys.executable).parent
SPEC = r"""workflow:
  name: team-demo
  groups:
  - name: gang
    tasks:
    - name: lead
      lead: true
      command: [sh, -c, "echo lead up; echo from-lead > \"{{output}}/note\""]
    - name: worker
      command: [sh, -c, "echo worker sees {{host:lead}}"]
  - name: after
    tasks:
    - name: read
      command: [sh, -c, "cat \"{{input:0}}/note\""]
      inputs:
      - task: lead
"""


def _env(home: Path, url: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("TRAINYARD_SERVER_URL", "TRAINYARD_TOKEN")
    }
    env.update(
        TRAINYARD_HOME=str(home), TRAINYARD_DATABASE_URL=url, PATH=f"{BIN}:{env.get('PATH', '')}"
    )
    return env


def _cli(
    home: Path, url: str, *args: str, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "trainyard"), *args],
        env=_env(home, url),
        text=True,
        capture_output=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def database(postgres_server: str) -> Iterator[str]:
    """A fresh database, named the way a team writes it: ``postgresql://`` with no driver."""
    for url in fresh_database(postgres_server, prefix="ty_server"):
        yield url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture
def home(tmp_path: Path, database: str) -> Iterator[Path]:
    made = tmp_path / "team home"  # short: the facts socket's path is at most 107 bytes
    made.mkdir()
    yield made
    _cli(made, database, "server", "stop", timeout_s=60)


def _tables(url: str) -> set[str]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ).all()
            return {r[0] for r in rows}
    finally:
        engine.dispose()


def test_a_fresh_database_gets_its_schema_and_a_workflow_completes(
    home: Path, database: str, tmp_path: Path
) -> None:
    assert _tables(database) == set()
    spec = tmp_path / "team.yaml"
    spec.write_text(SPEC)
    done = _cli(home, database, "workflow", "submit", str(spec), "--wait", "-t", "json")
    assert done.returncode == 0, done.stderr + (home / "server.log").read_text()
    final = json.loads(done.stdout)
    assert (final["id"], final["status"]) == ("team-demo-1", "COMPLETED")
    assert {"workflows", "workflow_counters", "apps"} <= _tables(database)
    assert not list(home.glob("*.db")), "the store must be PostgreSQL, not a file in the home"
    logs = _cli(home, database, "workflow", "logs", "team-demo-1", "--no-follow").stdout
    assert "from-lead" in logs and "worker sees" in logs
    listed = _cli(home, database, "workflow", "list", "-t", "json")
    assert [w["id"] for w in json.loads(listed.stdout)] == ["team-demo-1"]
    server = psutil.Process(json.loads((home / "server.lock").read_text())["pid"])
    children = server.children(recursive=True)
    assert children, "the server started no launcher"
    for child in children:  # the URL holds the database's password: no child inherits it
        with contextlib.suppress(psutil.NoSuchProcess):
            assert "TRAINYARD_DATABASE_URL" not in child.environ(), child.cmdline()


def test_a_second_server_on_the_same_database_is_refused_and_names_the_holder(
    home: Path, database: str, tmp_path: Path
) -> None:
    started = _cli(home, database, "server", "start")
    assert started.returncode == 0, started.stderr
    holder = json.loads((home / "server.lock").read_text())["pid"]
    other = tmp_path / "another home"
    other.mkdir()
    began = time.monotonic()
    second = subprocess.run(
        [sys.executable, "-m", "trainyard.server"],
        env=_env(other, database),
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert second.returncode == 4, second.stderr
    assert f"pid {holder}" in second.stderr and "advisory lock" in second.stderr
    assert time.monotonic() - began < 60


def test_a_server_whose_store_lock_is_cut_stops(home: Path, database: str) -> None:
    """The database drops the lock's session (a restart, a cut connection): another server
    could take the store now, so this one stops within a check interval (10 s)."""
    started = _cli(home, database, "server", "start")
    assert started.returncode == 0, started.stderr
    pid = json.loads((home / "server.lock").read_text())["pid"]
    engine = create_engine(
        database.replace("postgresql://", "postgresql+psycopg://", 1), isolation_level="AUTOCOMMIT"
    )
    try:
        with engine.connect() as conn:
            ended = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                    "application_name LIKE :app"
                ),
                {"app": f"trainyard-engine pid {pid} %"},
            ).scalar()
    finally:
        engine.dispose()
    assert ended == 1
    deadline = time.monotonic() + 40
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the server kept running without its lock"
        time.sleep(0.5)
    assert "PostgreSQL lock was lost" in (home / "server.log").read_text()
