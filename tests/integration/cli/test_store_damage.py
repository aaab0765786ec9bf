"""Issue 12 M4: a damaged SQLite store is refused, clearly, without a log flood.

The store file is really damaged: the b-tree page headers of every page but the first are
overwritten (SQLite then says "database disk image is malformed")."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from cli_e2e_support import processes_of, run_cli, wait_gone

from trainyard.engine.reconciler import Engine
from trainyard.errors import StoreError
from trainyard.store import Store

ECHO = """workflow:
  name: fine
  tasks:
  - name: t
    image: busybox
    command: [echo]
    args: [hi]
"""


def damage(db: Path) -> None:
    """Checkpoint the WAL into the file, then overwrite the header of pages 2..n."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    conn.close()
    size = db.stat().st_size
    assert size >= 3 * page_size, "too small a store to damage"
    with db.open("r+b") as handle:
        for offset in range(page_size, size, page_size):
            handle.seek(offset)
            handle.write(b"\xde\xad\xbe\xef" * 4)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "damaged home"
    made.mkdir()
    yield made
    run_cli(made, "server", "stop")
    assert not wait_gone(processes_of(made), timeout_s=30)


def test_submit_on_a_damaged_store_is_refused_with_what_to_do(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "fine.yaml"
    spec.write_text(ECHO)
    for _ in range(3):
        done = run_cli(home, "workflow", "submit", str(spec), "--wait")
        assert done.code == 0, done.err
    assert run_cli(home, "server", "stop").code == 0
    db = home / "trainyard.db"
    damage(db)

    got = run_cli(home, "workflow", "submit", str(spec))
    assert got.code == 6, (got.out, got.err)
    assert "Workflow submitted" not in got.out
    assert f"the store {db} is damaged (SQLite: " in got.err
    assert f"mv '{db}' '{db}.damaged'" in got.err
    assert len(got.err.splitlines()) == 1
    assert run_cli(home, "server", "status").code == 7  # no server runs on it
    size = (home / "server.log").stat().st_size
    time.sleep(3)
    assert (home / "server.log").stat().st_size == size  # nothing keeps writing errors
    again = run_cli(home, "workflow", "list")
    assert again.code == 6 and "damaged" in again.err


def test_a_store_damaged_under_a_running_server_refuses_submits_quietly(
    home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "fine.yaml"
    spec.write_text(ECHO)
    for _ in range(6):
        done = run_cli(home, "workflow", "submit", str(spec), "--wait")
        assert done.code == 0, done.err
    nap = tmp_path / "nap.yaml"
    nap.write_text(
        ECHO.replace("name: fine", "name: nap")
        .replace("[echo]", "[sleep]")
        .replace("[hi]", '["3"]')
    )
    napping = run_cli(home, "workflow", "submit", str(nap))  # its end must be saved later
    assert napping.code == 0, napping.err
    damage(home / "trainyard.db")  # the server keeps running
    got = run_cli(home, "workflow", "submit", str(spec))
    assert got.code == 6, (got.out, got.err)
    assert "Workflow submitted" not in got.out
    assert "is damaged (SQLite: database disk image is malformed)" in got.err
    assert "trainyard server stop" in got.err
    time.sleep(6)  # the nap has ended: every step of the engine now fails to save that
    size = (home / "server.log").stat().st_size
    time.sleep(5)
    grown = (home / "server.log").stat().st_size - size
    assert grown < 2000, (home / "server.log").read_text()[-3000:]  # was 44 KB/s
    assert run_cli(home, "workflow", "query", "fine-1").code == 6


def test_a_store_found_damaged_refuses_every_later_transaction(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    store = Store(f"sqlite:///{db}")
    for n in range(40):
        store.create_app(f"app-{n}", "me", "x" * 2000, {})
    store._engine.dispose()
    damage(db)
    damaged = Store(f"sqlite:///{db}")
    with pytest.raises(StoreError, match="damaged"):
        damaged.verify()
    with pytest.raises(StoreError, match="malformed"):
        damaged.list_apps()
    assert damaged.damaged is not None
    with pytest.raises(StoreError) as refused:
        damaged.get_app("app-1")
    assert str(refused.value) == damaged.damaged


def test_the_engine_loop_backs_off_while_every_step_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    engine = Engine(store, tmp_path, pools={}, poll_interval_s=0.01)
    store.damaged = "the store is damaged (test)"

    def failing_step() -> None:
        store.list_workflows()  # raises StoreError: the store is refused now

    engine.loop.step = failing_step  # type: ignore[method-assign]  # what run_forever calls
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="trainyard.engine"):
        thread = threading.Thread(target=engine.run_forever, args=(stop,))
        thread.start()
        time.sleep(3)
        stop.set()
        thread.join(timeout=40)
    failures = [r for r in caplog.records if "engine step failed" in r.getMessage()]
    # 3 s at a 0.01 s interval was ~300 tracebacks; doubling waits give about 9 steps
    assert 1 <= len(failures) <= 5, [r.getMessage() for r in failures]
