"""Spec warnings in the REST API's answers (in-process server over the fake backend)."""

from __future__ import annotations

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

REPEATED = """workflow:
  name: gh
  tasks:
  - name: t
    command: [echo, hi]
    command: [echo, bye]
"""


@pytest.fixture()
def client(tmp_path: Path) -> Iterator[TestClient]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=2))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as test_client:
        token = (tmp_path / "token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def _one_warning(rows: list[dict]) -> dict:
    (row,) = rows
    assert (row["path"], row["line"], row["file"]) == ("workflow.tasks[0].command", 6, "spec.yaml")
    assert (
        "(lines 5 and 6) with different values; the value of line 6 (['echo', 'bye'])"
        in row["message"]
    )
    return row


def test_validate_spec_submit_and_dry_run_answer_the_warnings(client: TestClient) -> None:
    body = {"spec_text": REPEATED}
    valid = client.post("/api/workflow/validate", json=body).json()
    assert valid["valid"] is True and _one_warning(valid["warnings"])
    assert client.post("/api/workflow/spec", json=body).text == REPEATED  # plain text as before
    shown = client.post("/api/workflow/spec", params={"format": "json"}, json=body).json()
    assert shown["spec"] == REPEATED and _one_warning(shown["warnings"])
    dry = client.post("/api/workflow", params={"dry_run": True}, json=body).json()
    assert _one_warning(dry["warnings"])
    submitted = client.post("/api/workflow", json=body).json()
    assert submitted["id"] == "gh-1" and _one_warning(submitted["warnings"])
    again = client.post("/api/workflow/gh-1/resubmit", json={"spec_text": ""}).json()
    assert again["id"] == "gh-2" and _one_warning(again["warnings"])


def test_a_refused_spec_answers_its_warnings_too(client: TestClient) -> None:
    bad = REPEATED + "    image: [not, a, string]\n"
    answer = client.post("/api/workflow/validate", json={"spec_text": bad})
    assert answer.status_code == 422 and answer.json()["kind"] == "SpecError"
    assert [row["path"] for row in answer.json()["detail"]] == ["workflow.tasks[0].image"]
    _one_warning(answer.json()["warnings"])
