"""``POST /api/workflow/{id}/task/{task}/entry`` (``workflow exec|port-forward|rsync``): the
rule of ``cancel`` (submitter or admin, never a task token), only a RUNNING attempt, unknown
task or retry 404, and the backend's own ``entry`` in the answer. The real app in-process
over the fake backend (a task that never ends by itself); the real entering is tested in
tests/integration/cli/test_interactive_verbs.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.base import TaskKey
from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.store import Store
from trainyard.tasktokens import task_token

SPEC = """
workflow:
  name: endless
  tasks:
  - name: t
    command: ["sleep", "1000"]
"""


class EnterableFake(FakeBackend):
    """The fake backend with the optional ``entry`` hook."""

    def entry(self, key: TaskKey) -> dict[str, Any]:
        return {"backend": "fake", "where": f"{key.task}/{key.retry_id}"}


@pytest.fixture(params=[EnterableFake, FakeBackend], ids=["hook", "no-hook"])
def api(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: request.param(lambda launch: Outcome(None)),
    )
    service = Service(engine)
    tokens = TokenRegistry(tmp_path, service.task_token_owner)
    with TestClient(create_app(service, tokens)) as client:
        client.headers["Authorization"] = f"Bearer {(tmp_path / 'token').read_text().strip()}"
        client.verbs_ctx = {
            "home": tmp_path,
            "tokens": tokens,  # type: ignore[attr-defined]
            "hook": request.param is EnterableFake,
        }
        yield client


def _running(client: TestClient) -> str:
    answer = client.post("/api/workflow", json={"spec_text": SPEC})
    assert answer.status_code == 200, answer.text
    wid = answer.json()["id"]
    deadline = time.monotonic() + 30
    while client.get(f"/api/workflow/{wid}").json()["groups"][0]["tasks"][0]["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return wid


def test_entry_of_a_running_task(api: TestClient) -> None:
    wid = _running(api)
    answer = api.post(f"/api/workflow/{wid}/task/t/entry")
    if api.verbs_ctx["hook"]:  # type: ignore[attr-defined]
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "workflow_id": wid,
            "task": "t",
            "retry_id": 0,
            "status": "RUNNING",
            "backend": "fake",
            "where": "t/0",
        }
    else:
        assert answer.json()["kind"] == "RefusedError"
        assert "cannot enter a running task" in answer.text


def test_unknown_task_or_retry_is_not_found(api: TestClient) -> None:
    wid = _running(api)
    nope = api.post(f"/api/workflow/{wid}/task/nope/entry")
    assert (nope.status_code, nope.json()["kind"]) == (404, "NotFoundError")
    assert "its tasks: t" in nope.text
    retry = api.post(f"/api/workflow/{wid}/task/t/entry", params={"retry_id": 4})
    assert (retry.status_code, retry.json()["kind"]) == (404, "NotFoundError")


def test_other_users_and_task_tokens_may_not_enter(api: TestClient) -> None:
    wid = _running(api)
    state = api.verbs_ctx  # type: ignore[attr-defined]
    other = state["tokens"].add("mallory")
    answer = api.post(
        f"/api/workflow/{wid}/task/t/entry", headers={"Authorization": f"Bearer {other}"}
    )
    assert answer.json()["kind"] == "ForbiddenError" and "belongs to" in answer.text, answer.text
    as_task = api.post(
        f"/api/workflow/{wid}/task/t/entry",
        headers={"Authorization": f"Bearer {task_token(state['home'], wid)}"},
    )
    assert as_task.json()["kind"] == "ForbiddenError" and "a task token" in as_task.text, (
        as_task.text
    )


def test_an_ended_task_is_refused(api: TestClient) -> None:
    wid = _running(api)
    assert api.post(f"/api/workflow/{wid}/cancel").status_code == 200
    deadline = time.monotonic() + 30
    while not api.get(f"/api/workflow/{wid}").json()["status"].startswith("FAILED"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    answer = api.post(f"/api/workflow/{wid}/task/t/entry")
    assert answer.json()["kind"] == "RefusedError" and "has ended" in answer.text
