"""The store's contract on both of its databases: SQLite and a real PostgreSQL server
(``store_url``, tests/conftest.py). Every test runs twice; a difference between the two is a
bug of the store, not of the test."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from trainyard.errors import NotFoundError, RefusedError, StoreError
from trainyard.store import Store
from trainyard.store.lock import with_driver


def _create(
    store: Store,
    name: str = "train",
    *,
    user: str = "alice",
    labels: dict[str, str] | None = None,
    pool: str = "local",
) -> str:
    record = store.create_workflow(
        name=name,
        pool=pool,
        submitted_by=user,
        labels=labels or {},
        spec_text="spec: é ✓",
        source={"file": "train.yaml"},
        make_state=lambda wid: ("PENDING", {"id": wid, "n": 1}),
    )
    return record.id


def test_a_workflow_round_trips_with_its_state_text_and_times(store_url: str) -> None:
    store = Store(store_url)
    state: dict[str, Any] = {
        "tasks": [{"name": "t", "exit_code": None, "note": "naïve ✓"}],
        "big": list(range(2000)),
        "float": 0.1 + 0.2,
    }
    record = store.create_workflow(
        name="train",
        pool="local",
        submitted_by="alice",
        labels={"team": "vision"},
        spec_text="workflow:\n  name: train  # ünïcode\n",
        source={"file": "a b.yaml"},
        make_state=lambda wid: ("PENDING", {**state, "id": wid}),
    )
    again = Store(store_url).get_workflow(record.id)  # a second engine object: from the db
    assert again == record
    assert again.state == {**state, "id": "train-1"}
    assert again.submit_time_s == record.submit_time_s  # a double, not a rounded float


def test_ids_count_per_name_and_seq_orders_all(store_url: str) -> None:
    store = Store(store_url)
    made = [_create(store, "a"), _create(store, "b"), _create(store, "a")]
    assert made == ["a-1", "b-1", "a-2"]
    assert store.peek_workflow_id("a") == "a-3" and store.peek_workflow_id("new") == "new-1"
    assert [r.id for r in store.list_workflows()] == ["a-2", "b-1", "a-1"]
    rows, total = store.page_workflows(oldest_first=True)
    assert ([r["id"] for r in rows], total) == (["a-1", "b-1", "a-2"], 3)


def test_a_refused_state_stores_nothing(store_url: str) -> None:
    store = Store(store_url)

    def refuse(_wid: str) -> tuple[str, dict[str, Any]]:
        raise ValueError("bad spec")

    with pytest.raises(ValueError, match="bad spec"):
        store.create_workflow(
            name="x",
            pool="p",
            submitted_by="u",
            labels={},
            spec_text="",
            source={},
            make_state=refuse,
        )
    assert store.list_workflows() == [] and store.peek_workflow_id("x") == "x-1"


def test_filters_pages_and_label_queries_agree(store_url: str) -> None:
    store = Store(store_url)
    first = _create(store, "train", labels={"team": "vision", "run": "1"})
    second = _create(store, "eval", user="bob", labels={"team": "nlp"}, pool="slurm")
    third = _create(store, "train", labels={"team": "vision", "run": "2"})
    store.save_states(
        {first: ("COMPLETED", 100.0, {"done": True}), second: ("FAILED", 200.0, {"done": True})}
    )
    assert [r.id for r in store.list_workflows(statuses=["PENDING"])] == [third]
    assert [r.id for r in store.list_workflows(name="rai")] == [third, first]
    assert [r.id for r in store.list_workflows(labels={"team": "vision", "run": "1"})] == [first]
    assert [r.id for r in store.list_workflows(submitted_by="bob")] == [second]
    assert [r.id for r in store.list_workflows(active_only=True)] == [third]
    assert [r.id for r in store.list_workflows(ended_since_s=150.0)] == [second]
    assert [r.id for r in store.list_workflows(ended_before_s=150.0)] == [first]
    assert [r.id for r in store.list_workflows(count=1)] == [third]
    rows, total = store.page_workflows(labels={"team": "vision"}, limit=1, offset=1)
    assert ([r["id"] for r in rows], total) == ([first], 2)
    rows, total = store.page_workflows(pool="slurm")
    assert (rows[0]["labels"], rows[0]["end_time_s"], total) == ({"team": "nlp"}, 200.0, 1)
    assert store.workflow_end_times([first, "nope-1"]) == {first: ("alice", 100.0)}
    assert store.get_workflow(first).state == {"done": True}
    assert store.delete_workflows([first, second, "nope-1"]) == 2
    assert [r.id for r in store.list_workflows()] == [third]
    with pytest.raises(NotFoundError):
        store.get_workflow(first)


def test_a_state_saved_for_a_vanished_workflow_rolls_back_the_whole_batch(store_url: str) -> None:
    store = Store(store_url)
    kept = _create(store)
    with pytest.raises(StoreError, match="vanished"):
        store.save_states({kept: ("RUNNING", None, {"n": 2}), "gone-1": ("RUNNING", None, {})})
    assert (store.get_workflow(kept).status, store.get_workflow(kept).state["n"]) == ("PENDING", 1)


def test_apps_version_list_and_delete(store_url: str) -> None:
    store = Store(store_url)
    assert store.create_app("hello", "alice", "v1", {"a.py": "print(1)"}).version == 1
    assert store.create_app("hello", "alice", "v2", {}).version == 2
    store.create_app("other", "bob", "o1", {})
    assert store.get_app("hello").spec_text == "v2"
    assert store.get_app("hello", 1).files == {"a.py": "print(1)"}
    assert [(a.name, a.version) for a in store.list_apps()] == [("hello", 2), ("other", 1)]
    assert store.delete_app("hello") == 2
    with pytest.raises(NotFoundError):
        store.get_app("hello")


def test_creates_at_once_from_many_connections_never_share_a_number(store_url: str) -> None:
    """Each thread has a Store (its own connections) as a server's request threads have; the
    old read-then-write numbering gave two of them the same id (IntegrityError) on both
    databases."""
    stores = [Store(store_url) for _ in range(4)]
    ids: list[str] = []
    errors: list[BaseException] = []

    def work(store: Store) -> None:
        try:
            for _ in range(8):
                ids.append(_create(store, "race"))
                store.create_app("race", "alice", "t", {})
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sorted(ids, key=lambda i: int(i.rsplit("-", 1)[1])) == [
        f"race-{n}" for n in range(1, 33)
    ]
    rows, total = stores[0].page_workflows(limit=100, oldest_first=True)
    assert total == 32 and len({r["id"] for r in rows}) == 32
    assert stores[0].get_app("race").version == 32


def test_postgresql_urls_without_a_driver_get_psycopg() -> None:
    assert (
        with_driver("postgresql://u:p%40ss@db:5432/ty")
        == "postgresql+psycopg://u:p%40ss@db:5432/ty"
    )
    assert (
        with_driver("postgres://u@db/ty?sslmode=require")
        == "postgresql+psycopg://u@db/ty?sslmode=require"
    )
    assert with_driver("postgresql+psycopg://u@db/ty") == "postgresql+psycopg://u@db/ty"
    assert with_driver("sqlite:////x/y.db") == "sqlite:////x/y.db"


def test_a_plain_postgresql_url_opens_the_store(postgres_server: str) -> None:
    from pg_support import fresh_database

    for url in fresh_database(postgres_server):
        plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
        assert _create(Store(plain)) == "train-1"


def test_an_unreachable_postgresql_is_a_store_error_without_the_password() -> None:
    pytest.importorskip("psycopg")
    url = "postgresql://ty:s3cret@/ty?host=/nonexistent-socket-dir"
    with pytest.raises(StoreError, match="cannot open the store") as caught:
        Store(url)
    assert "s3cret" not in str(caught.value)


def test_a_store_keeps_its_identity_and_a_new_store_gets_another(
    store_url: str, tmp_path: Path
) -> None:
    first = Store(store_url)
    assert len(first.identity) == 32 and Store(store_url).identity == first.identity
    assert Store(f"sqlite:///{tmp_path / 'other.db'}").identity != first.identity


def test_known_workflow_ids_answers_for_many_at_once(store_url: str) -> None:
    store = Store(store_url)
    made = {_create(store, "k") for _ in range(3)}
    asked = [f"k-{n}" for n in range(1, 1201)]
    assert store.known_workflow_ids(asked) == made


@pytest.mark.parametrize(
    ("name", "spec", "why"),
    [
        ("a" * 201, "t", "201 characters long"),
        ("a\x00b", "t", "NUL"),
        ("ok", "spec\x00", "NUL"),
    ],
)
def test_app_texts_one_database_would_not_store_are_refused_alike(
    store_url: str, name: str, spec: str, why: str
) -> None:
    """PostgreSQL refuses NUL in text and values longer than a String(200) column (a
    StoreError, exit 6, as for a damaged store); SQLite stored them. Both refuse now."""
    store = Store(store_url)
    with pytest.raises(RefusedError, match=why):
        store.create_app(name, "alice", spec, {})
    assert store.list_apps() == []
    assert store.create_app("a" * 200, "alice", "t", {}).version == 1
