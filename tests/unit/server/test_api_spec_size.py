"""The API refuses a spec over ``spec.MAX_SPEC_BYTES`` (422) and a body over
``MAX_BODY_BYTES`` before parsing it (413), both as a spec refusal (``kind: SpecError``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.cli.client import _raise_for
from trainyard.engine.reconciler import Engine
from trainyard.errors import SpecError
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.bodylimit import MAX_BODY_BYTES
from trainyard.server.service import Service
from trainyard.spec import MAX_SPEC_BYTES
from trainyard.store import Store

SPEC = "workflow:\n  name: big\n  tasks:\n  - name: t\n    command: [echo]\n    args: ['{pad}']\n"


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


def test_the_body_cap_fits_any_spec_under_the_limit_escaped() -> None:
    assert MAX_BODY_BYTES > len(json.dumps({"spec_text": "\x01" * MAX_SPEC_BYTES}))


def test_a_spec_over_the_limit_is_refused_with_both_sizes_and_stores_nothing(
    client: TestClient,
) -> None:
    body = {"spec_text": SPEC.format(pad="x" * (MAX_SPEC_BYTES + 10))}
    for path in ("/api/workflow/validate", "/api/workflow", "/api/workflow/spec"):
        answer = client.post(path, json=body)
        assert (answer.status_code, answer.json()["kind"]) == (422, "SpecError"), path
        (row,) = answer.json()["detail"]
        assert row["message"].startswith(
            "the spec is 4.0 MiB (4,194,392 bytes), over the limit "
            "of 4.0 MiB (4,194,304 bytes) of spec text"
        )
    files = {"spec_text": SPEC.format(pad="x"), "files": {"a": "y" * MAX_SPEC_BYTES}}
    answer = client.post("/api/workflow", json=files)
    assert "the spec with its localpath files is 4.0 MiB" in answer.json()["detail"][0]["message"]
    assert client.get("/api/workflow").json() == []


def test_a_body_over_the_cap_is_413_before_it_is_parsed(client: TestClient) -> None:
    answer = client.post(
        "/api/workflow",
        content=b"{" + b" " * MAX_BODY_BYTES + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert (answer.status_code, answer.json()["kind"]) == (413, "SpecError")
    assert answer.json()["detail"][0]["message"].startswith(
        "the request is 24.1 MiB (25,231,362 bytes), over the limit of 24.1 MiB (25,231,360 bytes)"
    )
    with pytest.raises(SpecError) as caught:  # the CLI reads it as a refused spec: exit 2
        _raise_for(answer)
    assert caught.value.exit_code == 2


def test_a_body_without_a_length_is_counted_as_it_arrives(client: TestClient) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"spec_text": "'
        for _ in range(30):
            yield b"x" * 2**20
        yield b'"}'

    answer = client.post(
        "/api/workflow", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert (answer.status_code, answer.json()["kind"]) == (413, "SpecError")
    assert answer.json()["detail"][0]["message"].startswith("the request is more than ")


def test_the_body_is_counted_by_fastapis_own_limit(client: TestClient) -> None:
    assert client.app.max_body_size == MAX_BODY_BYTES  # type: ignore[attr-defined]
