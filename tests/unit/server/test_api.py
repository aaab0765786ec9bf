"""The REST API in-process (FastAPI TestClient) over the fake backend: auth, shapes, errors."""

from __future__ import annotations

import json
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
    image: ubuntu:24.04
    command: ["echo"]
    args: ["Hello from OSMO!"]
default-values:
  name: hello-osmo
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


def _admin(tmp_path: Path) -> str:
    return (tmp_path / "token").read_text().strip()


def _wait_done(client: TestClient, wid: str, token: str) -> dict:
    for _ in range(200):
        data = client.get(f"/api/workflow/{wid}", headers=_auth(token)).json()
        if data["status"] in ("COMPLETED",) or data["status"].startswith("FAILED"):
            return data
        time.sleep(0.05)
    raise AssertionError(f"{wid} did not finish: {data}")


def test_requests_without_or_with_a_wrong_token_are_refused(api, tmp_path: Path) -> None:
    client, _tokens = api
    assert client.get("/api/workflow").status_code == 401
    assert client.get("/api/workflow", headers=_auth("nope")).status_code == 401
    assert client.get("/api/workflow", headers=_auth(_admin(tmp_path))).status_code == 200
    assert client.get("/api/health").status_code == 200


def test_token_file_is_private(api, tmp_path: Path) -> None:
    assert (tmp_path / "token").stat().st_mode & 0o077 == 0
    assert (tmp_path / "tokens.json").stat().st_mode & 0o077 == 0


def test_submit_query_list_shapes(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    answer = client.post(
        "/api/workflow", json={"spec_text": HELLO, "set": ["name=greetings"]}, headers=_auth(token)
    )
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]
    assert wid == "greetings-1"
    data = _wait_done(client, wid, token)
    assert data["status"] == "COMPLETED"
    task = data["groups"][0]["tasks"][0]
    assert set(task) >= {
        "name",
        "status",
        "lead",
        "retry_id",
        "exit_code",
        "node",
        "start_time",
        "end_time",
    }
    assert task["lead"] is True and task["exit_code"] == 0
    rows = client.get("/api/workflow", headers=_auth(token)).json()
    assert [r["id"] for r in rows] == [wid]
    assert rows[0]["submit_time"].endswith("+00:00")


def test_refused_spec_answers_every_problem_and_creates_nothing(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    bad = HELLO.replace('command: ["echo"]', "command: []")
    answer = client.post("/api/workflow", json={"spec_text": bad}, headers=_auth(token))
    assert answer.status_code == 422
    assert any("command" in row["path"] for row in answer.json()["detail"])
    assert client.get("/api/workflow", headers=_auth(token)).json() == []


def test_a_user_cannot_read_or_cancel_another_users_workflow(api, tmp_path: Path) -> None:
    client, tokens = api
    alice, bob = tokens.add("alice"), tokens.add("bob")
    wid = client.post("/api/workflow", json={"spec_text": HELLO}, headers=_auth(alice)).json()["id"]
    assert client.get(f"/api/workflow/{wid}", headers=_auth(bob)).status_code == 403
    assert client.post(f"/api/workflow/{wid}/cancel", headers=_auth(bob)).status_code == 403
    assert client.get("/api/workflow", headers=_auth(bob)).json() == []
    assert client.get(f"/api/workflow/{wid}", headers=_auth(_admin(tmp_path))).status_code == 200
    assert (
        client.get(f"/api/workflow/{wid}", headers=_auth(alice)).json()["submitted_by"] == "alice"
    )


def test_unknown_workflow_is_404_with_what_to_do(api, tmp_path: Path) -> None:
    client, _ = api
    answer = client.get("/api/workflow/nope-1", headers=_auth(_admin(tmp_path)))
    assert answer.status_code == 404
    assert "workflow list" in answer.json()["detail"][0]["message"]


def test_dry_run_on_a_slurm_pool_shows_the_sbatch_script_and_stores_nothing(tmp_path: Path) -> None:
    from trainyard.backends.slurm import SlurmBackend
    from trainyard.pools import NodeSpec, Pool

    slurm = Pool(
        name="slurm-pool",
        backend="slurm",
        options={"partition": "batch"},
        nodes=[NodeSpec(name="n1"), NodeSpec(name="n2")],
    )
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool(), slurm.name: slurm},
        backend_factory=lambda p, h: (
            SlurmBackend(p, h, python="/usr/bin/python3") if p.backend == "slurm" else FakeBackend()
        ),
    )
    tokens = TokenRegistry(tmp_path)
    with TestClient(create_app(Service(engine), tokens, run_engine=False)) as client:
        got = client.post(
            "/api/workflow",
            params={"dry_run": True},
            headers=_auth(_admin(tmp_path)),
            json={"spec_text": HELLO, "pool": "slurm-pool"},
        ).json()
        local = client.post(
            "/api/workflow",
            params={"dry_run": True},
            headers=_auth(_admin(tmp_path)),
            json={"spec_text": HELLO},
        ).json()
    assert got["dry_run"] is True and got["pool"] == "slurm-pool"
    (shown,) = got["backend"]
    assert shown["group"] == "hello" and shown["text"].startswith("$ sbatch ")
    assert "--partition=batch" in shown["text"] and "hello-osmo-1" in shown["text"]
    assert local["backend"] == [] and "Hello from OSMO!" in local["spec"]
    assert engine.store.list_workflows() == []


def _submit_done(client: TestClient, token: str, spec_text: str = HELLO) -> str:
    answer = client.post("/api/workflow", json={"spec_text": spec_text}, headers=_auth(token))
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]
    _wait_done(client, wid, token)
    return wid


def test_resubmit_dry_run_shows_the_stored_spec_and_stores_nothing(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    wid = _submit_done(client, token)
    got = client.post(
        f"/api/workflow/{wid}/resubmit",
        params={"dry_run": True},
        json={"spec_text": "", "set": ["name=again"]},
        headers=_auth(token),
    )
    assert got.status_code == 200, got.text
    assert got.json()["dry_run"] is True and got.json()["name"] == "again"
    assert "Hello from OSMO!" in got.json()["spec"]
    assert [w["id"] for w in client.get("/api/workflow", headers=_auth(token)).json()] == [wid]


def test_restarting_a_completed_workflow_is_refused_with_its_error_class(
    api, tmp_path: Path
) -> None:
    client, _ = api
    token = _admin(tmp_path)
    wid = _submit_done(client, token)
    answer = client.post(f"/api/workflow/{wid}/restart", headers=_auth(token))
    assert answer.status_code == 409
    assert answer.json()["kind"] == "RefusedError"
    assert "COMPLETED" in answer.json()["detail"][0]["message"]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (
            {"status": "BOGUS"},
            "unknown workflow status 'BOGUS'; statuses: PENDING, WAITING, RUNNING",
        ),
        ({"count": 0}, "count must be at least 1, not 0"),
        ({"count": -3}, "count must be at least 1, not -3"),
    ],
)
def test_list_refuses_bad_filters(api, tmp_path: Path, params: dict, expected: str) -> None:
    client, _ = api
    answer = client.get("/api/workflow", params=params, headers=_auth(_admin(tmp_path)))
    assert answer.status_code == 400 and answer.json()["kind"] == "BadArgumentError"
    assert answer.json()["detail"][0]["message"].startswith(expected)


def _write_log(tmp_path: Path, wid: str, task: str, lines: list[str]) -> None:
    run_dir = tmp_path / "runs" / wid / task / "0"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "task.log").write_text(
        "".join(f"2026/01/02 03:04:{i:02d} [{task}] {text}\n" for i, text in enumerate(lines))
    )


def test_logs_as_json_lines(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    wid = _submit_done(client, token)
    _write_log(tmp_path, wid, "hello", ["first", "second"])
    answer = client.get(
        f"/api/workflow/{wid}/logs", params={"format": "json"}, headers=_auth(token)
    )
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    rows = [json.loads(line) for line in answer.text.splitlines()]
    assert rows == [
        {
            "time": "2026-01-02T03:04:00+00:00",
            "task": "hello",
            "retry_id": 0,
            "line": "first",
            "source": "task",
            "cut": False,
        },
        {
            "time": "2026-01-02T03:04:01+00:00",
            "task": "hello",
            "retry_id": 0,
            "line": "second",
            "source": "task",
            "cut": False,
        },
    ]


def test_follow_keeps_only_the_last_lines_of_the_backlog(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    wid = _submit_done(client, token)
    _write_log(tmp_path, wid, "hello", ["one", "two", "three"])
    answer = client.get(
        f"/api/workflow/{wid}/logs", params={"follow": True, "lines": 2}, headers=_auth(token)
    )
    assert answer.text.splitlines() == [
        "2026/01/02 03:04:01 [hello] two",
        "2026/01/02 03:04:02 [hello] three",
    ]
    everything = client.get(
        f"/api/workflow/{wid}/logs", params={"follow": True}, headers=_auth(token)
    )
    assert len(everything.text.splitlines()) == 3


def _create_app(client: TestClient, token: str, name: str = "greeter") -> object:
    return client.post(f"/api/app/{name}", json={"spec_text": HELLO}, headers=_auth(token))


def test_only_the_owner_or_an_admin_may_change_or_delete_an_app(api, tmp_path: Path) -> None:
    client, tokens = api
    alice, bob, admin = tokens.add("alice"), tokens.add("bob"), _admin(tmp_path)
    made = _create_app(client, alice).json()
    assert {k: made[k] for k in ("name", "version", "warnings", "owner", "description")} == {
        "name": "greeter",
        "version": 1,
        "warnings": [],
        "owner": "alice",
        "description": "",
    }
    for answer in (_create_app(client, bob), client.delete("/api/app/greeter", headers=_auth(bob))):
        assert answer.status_code == 403, answer.text
        assert "belongs to alice" in answer.json()["detail"][0]["message"]
    assert client.get("/api/app/greeter", headers=_auth(bob)).json()["version"] == 1
    assert _create_app(client, alice).json()["version"] == 2  # the owner adds versions
    assert _create_app(client, admin).json()["version"] == 3  # so may an admin
    shown = client.get("/api/app/greeter", headers=_auth(bob)).json()
    assert (shown["version"], shown["owner"]) == (3, "alice")  # the app keeps its owner
    gone = client.delete("/api/app/greeter", headers=_auth(admin))
    assert gone.status_code == 200 and gone.json()["deleted_versions"] == 3
    assert client.get("/api/app/greeter", headers=_auth(alice)).status_code == 404


def test_app_submit_dry_run_and_create_with_check_values(api, tmp_path: Path) -> None:
    client, _ = api
    token = _admin(tmp_path)
    template = HELLO.replace("name: hello-osmo", "other: x").replace(
        '["Hello from OSMO!"]', '["{{ url }}"]'
    )
    refused = client.post("/api/app/tpl", json={"spec_text": template}, headers=_auth(token))
    assert refused.status_code == 422 and "'name' is not set" in refused.text
    made = client.post(
        "/api/app/tpl",
        json={"spec_text": template, "set": ["name=n", "url=u"]},
        headers=_auth(token),
    )
    assert made.status_code == 200, made.text
    dry = client.post(
        "/api/app/tpl/submit",
        params={"dry_run": True},
        json={"spec_text": "", "set": ["name=dry", "url=file:///x"]},
        headers=_auth(token),
    )
    assert dry.status_code == 200, dry.text
    assert dry.json()["name"] == "dry" and "file:///x" in dry.json()["spec"]
    assert client.get("/api/workflow", headers=_auth(token)).json() == []


READER = """
workflow:
  name: reader
  tasks:
  - name: read
    command: ["cat", "{{input:0}}/x"]
    inputs:
    - task: {ref}
"""


def test_an_input_from_another_workflow_must_exist_and_be_readable(api) -> None:
    client, tokens = api
    alice, bob = tokens.add("alice"), tokens.add("bob")
    made = client.post("/api/workflow", json={"spec_text": HELLO}, headers=_auth(alice)).json()
    _wait_done(client, made["id"], alice)

    def submit(ref: str, token: str):
        return client.post(
            "/api/workflow", json={"spec_text": READER.replace("{ref}", ref)}, headers=_auth(token)
        )

    missing = submit("nobody-7:hello", alice)
    assert missing.status_code == 404 and missing.json()["kind"] == "NotFoundError"
    assert "task 'read' input 0 (nobody-7:hello): no workflow nobody-7" in missing.text
    theirs = submit(f"{made['id']}:hello", bob)  # bob may not read alice's output
    assert theirs.status_code == 403 and "belongs to alice" in theirs.text
    dry = client.post(
        "/api/workflow",
        params={"dry_run": True},
        headers=_auth(bob),
        json={"spec_text": READER.replace("{ref}", f"{made['id']}:hello")},
    )
    assert dry.status_code == 403
    ok = submit(f"{made['id']}:hello", alice)
    assert ok.status_code == 200, ok.text
    listed = client.get("/api/workflow", headers=_auth(bob)).json()
    assert listed == []  # the refused submissions stored nothing
