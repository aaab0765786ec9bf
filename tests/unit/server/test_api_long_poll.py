"""``GET /api/workflow/{id}?known=KEY&wait_s=S``: the long poll ``--wait`` uses (issue 15).

The real app in-process (FastAPI TestClient, the engine's loop running) over the fake
backend, whose scripted task ends after a number of engine polls (or never).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server import workflow_reads
from trainyard.server.app import PROGRESS_HEADER, create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.store import Store

SPEC = """
workflow:
  name: {{ name }}
  tasks:
  - name: hello
    image: ubuntu:24.04
    command: ["echo"]
    args: ["hi"]
default-values:
  name: short
"""


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[TestClient]:
    def script(launch) -> Outcome:  # a workflow named "endless" never ends by itself
        return (
            Outcome(None) if launch.key.workflow_id.startswith("endless") else Outcome(0, polls=20)
        )

    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: FakeBackend(script),
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as client:
        client.headers["Authorization"] = f"Bearer {(tmp_path / 'token').read_text().strip()}"
        yield client


def _submit(client: TestClient, name: str) -> str:
    answer = client.post("/api/workflow", json={"spec_text": SPEC, "set": [f"name={name}"]})
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


def _terminal(status: str) -> bool:
    return status == "COMPLETED" or status.startswith("FAILED")


def test_long_poll_answers_at_each_change_and_at_once_at_the_end(api: TestClient) -> None:
    wid = _submit(api, "short")
    answer = api.get(f"/api/workflow/{wid}")
    key, seen = answer.headers[PROGRESS_HEADER], [answer.json()["status"]]
    deadline = time.monotonic() + 60
    while not _terminal(seen[-1]):
        assert time.monotonic() < deadline, f"{wid} did not end: {seen}"
        asked = time.monotonic()
        answer = api.get(f"/api/workflow/{wid}", params={"known": key, "wait_s": 10})
        # held until something changed: never answered with the same key before wait_s
        assert answer.headers[PROGRESS_HEADER] != key or time.monotonic() - asked >= 9.5
        key = answer.headers[PROGRESS_HEADER]
        seen.append(answer.json()["status"])
    assert seen[-1] == "COMPLETED"
    started = time.monotonic()
    again = api.get(f"/api/workflow/{wid}", params={"known": key, "wait_s": 10})
    assert time.monotonic() - started < 5, "an ended workflow is answered at once"
    assert again.headers[PROGRESS_HEADER] == key and again.json()["status"] == "COMPLETED"


def test_long_poll_without_change_answers_after_wait_s(api: TestClient) -> None:
    wid = _submit(api, "endless")
    deadline = time.monotonic() + 60
    while (answer := api.get(f"/api/workflow/{wid}")).json()["groups"][0]["tasks"][0][
        "status"
    ] != "RUNNING":
        assert time.monotonic() < deadline, answer.json()
        time.sleep(0.05)
    key = answer.headers[PROGRESS_HEADER]
    started = time.monotonic()
    held = api.get(f"/api/workflow/{wid}", params={"known": key, "wait_s": 0.5})
    assert time.monotonic() - started >= 0.45
    assert held.status_code == 200 and held.headers[PROGRESS_HEADER] == key
    api.post(f"/api/workflow/{wid}/cancel")


def test_plain_query_is_not_held_and_unknown_workflow_is_404(api: TestClient) -> None:
    wid = _submit(api, "endless")
    started = time.monotonic()
    assert api.get(f"/api/workflow/{wid}", params={"wait_s": 10}).status_code == 200
    assert time.monotonic() - started < 5, "without known= nothing is held"
    assert api.get("/api/workflow/nope-1", params={"known": "x", "wait_s": 10}).status_code == 404
    api.post(f"/api/workflow/{wid}/cancel")


def test_long_polls_beyond_the_limit_are_answered_at_once(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = threading.BoundedSemaphore(1)
    full.acquire()  # every hold in use
    monkeypatch.setattr(workflow_reads, "_HELD_QUERIES", full)
    wid = _submit(api, "endless")
    key = api.get(f"/api/workflow/{wid}").headers[PROGRESS_HEADER]
    started = time.monotonic()
    answer = api.get(f"/api/workflow/{wid}", params={"known": key, "wait_s": 10})
    assert answer.status_code == 200 and time.monotonic() - started < 5
    api.post(f"/api/workflow/{wid}/cancel")
