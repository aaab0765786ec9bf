"""The REST API behind the CLI's OSMO-parity commands (issue 13), in-process over the fake
backend and a real SQLite store: list filters, cancel of an ended workflow, events, tasks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.store import Store

HELLO = """
workflow:
  name: {{ name }}
  tasks:
  - name: hello
    command: ["echo"]
default-values:
  name: hello
"""


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, TokenRegistry]]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=2))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    tokens = TokenRegistry(tmp_path)
    with TestClient(create_app(Service(engine), tokens)) as client:
        yield client, tokens


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _submit(client: TestClient, token: str, name: str) -> str:
    answer = client.post(
        "/api/workflow", json={"spec_text": HELLO, "set": [f"name={name}"]}, headers=_auth(token)
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _wait_done(client: TestClient, wid: str, token: str) -> dict:
    for _ in range(400):
        data = client.get(f"/api/workflow/{wid}", headers=_auth(token)).json()
        if data["status"] == "COMPLETED" or data["status"].startswith("FAILED"):
            return data
        time.sleep(0.05)
    raise AssertionError(f"{wid} did not finish: {data}")


def test_list_filters_user_offset_order_and_dates(api, tmp_path: Path) -> None:
    client, tokens = api
    admin = (tmp_path / "token").read_text().strip()
    alice, bob = tokens.add("alice"), tokens.add("bob")
    ids = [_submit(client, alice, "a"), _submit(client, alice, "b"), _submit(client, bob, "c")]

    def listed(token: str, **params: object) -> list[str]:
        answer = client.get("/api/workflow", params=params, headers=_auth(token))
        assert answer.status_code == 200, answer.text
        return [w["id"] for w in answer.json()]

    assert listed(admin) == ids[::-1]
    assert listed(admin, user="alice") == ids[1::-1]
    assert listed(admin, user="alice", order="asc") == ids[:2]
    assert listed(admin, offset=1, count=1) == [ids[1]]
    assert listed(admin, pool="local") == ids[::-1] and listed(admin, pool="nope") == []
    assert listed(alice) == ids[1::-1]  # a user sees their own only
    assert listed(admin, submitted_after_s=time.time() + 60) == []
    assert listed(admin, submitted_before_s=time.time() + 60) == ids[::-1]
    refused = client.get("/api/workflow", params={"user": "bob"}, headers=_auth(alice))
    assert refused.status_code == 403 and "admin" in refused.text
    assert (
        client.get("/api/workflow", params={"offset": -1}, headers=_auth(admin)).status_code == 400
    )


def test_cancel_says_had_ended_events_and_tasks(api, tmp_path: Path) -> None:
    client, _tokens = api
    admin = (tmp_path / "token").read_text().strip()
    wid = _submit(client, admin, "done")
    assert _wait_done(client, wid, admin)["status"] == "COMPLETED"
    answer = client.post(f"/api/workflow/{wid}/cancel", headers=_auth(admin)).json()
    assert (answer["status"], answer["had_ended"]) == ("COMPLETED", True)

    events = client.get(f"/api/workflow/{wid}/events", headers=_auth(admin)).json()
    assert events[-1]["task"] == "hello" and events[-1]["event"] == "COMPLETED"
    assert events[-1]["time"].endswith("+00:00") and events[-1]["exit_code"] == 0
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)

    tasks = client.get("/api/task", params={"workflow": wid}, headers=_auth(admin)).json()
    assert [
        (t["workflow"], t["name"], t["status"], t["retry_id"], t["exit_code"]) for t in tasks
    ] == [(wid, "hello", "COMPLETED", 0, 0)]
    assert [t["workflow"] for t in client.get("/api/task", headers=_auth(admin)).json()] == [wid]
    assert (
        client.get("/api/task", params={"workflow": "nope-1"}, headers=_auth(admin)).status_code
        == 404
    )


def _write_pools(path: Path, text: str) -> None:
    """Write the pools file and move its modification time on (a coarse clock could
    otherwise give two writes within one tick the same time)."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 10**9, before + 10**9))


POOL = "pools:\n  {name}:\n    backend: local\n    node_count: {nodes}\n"


def test_pools_yaml_edits_apply_without_a_restart_and_a_bad_file_keeps_the_pools(
    tmp_path: Path,
) -> None:
    from trainyard.backends.served import load_pool_file

    pools_file = tmp_path / "pools.yaml"
    _write_pools(pools_file, POOL.format(name="a", nodes=1))
    backend = FakeBackend(lambda launch: Outcome(0, polls=10**9))  # runs until cancelled
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools=load_pool_file(pools_file)[0],
        backend_factory=lambda p, h: backend,
    )
    tokens = TokenRegistry(tmp_path)
    service = Service(engine, pools_file=pools_file)
    with TestClient(create_app(service, tokens)) as client:
        admin = _auth((tmp_path / "token").read_text().strip())

        def names() -> list[str]:
            return [p["name"] for p in client.get("/api/pool", headers=admin).json()]

        assert names() == ["local", "a"]
        _write_pools(pools_file, POOL.format(name="a", nodes=1) + "  b:\n    backend: local\n")
        assert sorted(names()) == ["a", "b", "local"]  # no restart, no reload command

        _write_pools(pools_file, "pools:\n  a: {backend: local, nodes: [{name: x, gpu: lots}]}\n")
        assert sorted(names()) == ["a", "b", "local"]  # refused whole: the old pools stay
        assert "pool 'a'" in service.pools.error and "keeps serving" in service.pools.error
        refused = client.post("/api/pool/reload", headers=admin)
        assert refused.status_code == 400 and "pool 'a'" in refused.text, refused.text

        # a pool in use keeps its definition until its workflows end; an idle one changes
        wid = client.post(
            "/api/workflow", headers=admin, json={"spec_text": HELLO, "pool": "a"}
        ).json()["id"]
        _write_pools(
            pools_file,
            POOL.format(name="a", nodes=3) + POOL.format(name="b", nodes=2).replace("pools:\n", ""),
        )
        answer = client.post("/api/pool/reload", headers=admin).json()
        assert answer["kept"] == ["a"] and answer["error"] is None
        nodes = {p["name"]: p["nodes"] for p in client.get("/api/pool", headers=admin).json()}
        assert nodes == {"local": 4, "a": 1, "b": 2}
        client.post(f"/api/workflow/{wid}/cancel", headers=admin)
        _wait_done(client, wid, (tmp_path / "token").read_text().strip())
        nodes = {p["name"]: p["nodes"] for p in client.get("/api/pool", headers=admin).json()}
        assert nodes == {"local": 4, "a": 3, "b": 2}  # applied once it ended
