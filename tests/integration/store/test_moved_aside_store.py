"""Issue 24: after the README's recovery ("move the damaged store aside") a new store gives
workflow ids from 1 again; nothing of the old store's ``train-1`` may reach the new
``train-1`` of another user: not its task token, not its run folder (logs, private root,
outputs). The same holds for a server pointed at a new PostgreSQL database. Written as the
attack: the old task kept its token and left a file in its output; both must be dead ends."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainyard.backends.fake import FakeBackend
from trainyard.engine.homestore import IDENTITY_FILE, bind_home
from trainyard.engine.reconciler import Engine, Submission
from trainyard.pools import NodeSpec, Pool
from trainyard.spec.models import WorkflowSpec
from trainyard.status import WorkflowStatus
from trainyard.store import Store
from trainyard.tasktokens import task_token, token_workflow

POOL = Pool(name="local", nodes=[NodeSpec(name="n0", gpu=8)])
SPEC = WorkflowSpec.model_validate({"name": "train", "tasks": [{"name": "t", "command": ["true"]}]})


def _run(home: Path, url: str, user: str) -> tuple[Engine, str]:
    engine = Engine(
        Store(url), home, pools={"local": POOL}, backend_factory=lambda p, h: FakeBackend()
    )
    wid = engine.submit(Submission(spec=SPEC, spec_text="", user=user, pool=POOL)).id
    assert engine.wait(wid, timeout_s=10).status == WorkflowStatus.COMPLETED
    return engine, wid


@pytest.fixture
def new_store(request: pytest.FixtureRequest, store_url: str) -> Iterator[str]:
    """What replaces ``store_url`` after the recovery: the SQLite file moved aside (the
    README's words: the file and its -wal and -shm files) so that the same URL makes an
    empty store; for PostgreSQL, a new database."""
    if store_url.startswith("sqlite"):
        path = Path(store_url.removeprefix("sqlite:///"))
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{path}{suffix}").exists():
                os.rename(f"{path}{suffix}", f"{path}.damaged{suffix}")
        yield store_url
        return
    from pg_support import fresh_database

    yield from fresh_database(request.getfixturevalue("postgres_server"))


def test_an_old_token_and_run_folder_never_reach_the_new_stores_same_id(
    tmp_path: Path, store_url: str, request: pytest.FixtureRequest
) -> None:
    home = tmp_path / "home"
    old_engine, old_id = _run(home, store_url, "alice")
    old_token = task_token(home, old_id)
    planted = home / "runs" / old_id / "t" / "0" / "output" / "from-alice"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("alice's output")
    old_engine.close()

    replacement = request.getfixturevalue("new_store")
    new_engine, new_id = _run(home, replacement, "bob")
    assert new_id == old_id == "train-1"  # ids count from 1 in the new store...
    assert token_workflow(home, old_token) is None  # ...but alice's token names nothing
    assert task_token(home, new_id) != old_token
    assert not (home / "runs" / new_id / "t" / "0" / "output" / "from-alice").exists()
    (aside,) = home.glob("runs.before-*")
    assert (
        aside / old_id / "t" / "0" / "output" / "from-alice"
    ).read_text() == "alice's output"  # moved aside, never deleted
    new_engine.close()

    again = Engine(
        Store(replacement), home, pools={"local": POOL}, backend_factory=lambda p, h: FakeBackend()
    )  # a plain restart
    assert token_workflow(home, task_token(home, new_id)) == new_id
    assert list(home.glob("runs.before-*")) == [aside]
    again.close()


def test_a_restart_on_the_same_store_keeps_tokens_and_run_folders(
    tmp_path: Path, store_url: str
) -> None:
    home = tmp_path / "home"
    engine, wid = _run(home, store_url, "alice")
    token = task_token(home, wid)
    engine.close()
    assert bind_home(home, Store(store_url)) is False
    assert token_workflow(home, token) == wid
    assert not list(home.glob("runs.before-*"))


@pytest.mark.parametrize("known", [True, False])
def test_a_home_made_before_the_record_judges_by_its_run_folders(
    tmp_path: Path, store_url: str, known: bool
) -> None:
    home = tmp_path / "home"
    store = Store(store_url)
    if known:
        store.create_workflow(
            name="train",
            pool="local",
            submitted_by="alice",
            labels={},
            spec_text="",
            source={},
            make_state=lambda w: ("PENDING", {}),
        )
    (home / "runs" / "train-1").mkdir(parents=True)
    token = task_token(home, "train-1")
    assert not (home / IDENTITY_FILE).exists()
    assert bind_home(home, store) is (not known)
    assert (token_workflow(home, token) == "train-1") is known
    assert (home / "runs" / "train-1").exists() is known
    assert (home / IDENTITY_FILE).read_text().strip() == store.identity
