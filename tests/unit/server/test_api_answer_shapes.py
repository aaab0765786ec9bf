"""Every REST answer the CLI reads has the shape its TypedDict in ``server.answers`` says (the
type the server's route returns and the CLI reads it as): no key missing, none unknown. The
API in-process (FastAPI TestClient) over the fake backend."""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server import answers
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.service import Service
from trainyard.store import Store

HELLO = """
workflow:
  name: hello
  tasks:
  - name: hello
    image: ubuntu:24.04
    command: ["echo"]
"""


@pytest.fixture()
def api(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    backend = FakeBackend(lambda launch: Outcome(0, polls=1))
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: backend,
    )
    with TestClient(create_app(Service(engine), TokenRegistry(tmp_path))) as client:
        yield client, {"Authorization": f"Bearer {(tmp_path / 'token').read_text().strip()}"}


def assert_shape(value: object, shape: Any) -> None:
    """``value`` (JSON) has exactly the keys of TypedDict ``shape``, nested TypedDicts too."""
    assert isinstance(value, dict), value
    hints = typing.get_type_hints(shape, include_extras=True)  # NotRequired kept
    optional = {k for k, h in hints.items() if typing.get_origin(h) is typing.NotRequired}
    required = set(hints) - optional
    assert required <= set(value) <= set(hints), (shape.__name__, sorted(value))
    for key, hint in hints.items():
        if key in value and typing.is_typeddict(hint):
            assert_shape(value[key], hint)


def answer(client: TestClient, method: str, path: str, auth: dict[str, str], **kw: Any) -> Any:
    got = client.request(method, path, headers=auth, **kw)
    assert got.status_code == 200, got.text
    return got.json()


def test_each_answer_the_cli_reads_has_its_typed_shape(api: tuple[TestClient, dict]) -> None:
    client, auth = api
    made = answer(client, "POST", "/api/workflow", auth, json={"spec_text": HELLO})
    wid = made["id"]
    for _ in range(400):
        if answer(client, "GET", f"/api/workflow/{wid}", auth)["status"] == "COMPLETED":
            break
    events = answer(client, "GET", f"/api/workflow/{wid}/events", auth)
    tasks = answer(client, "GET", "/api/task", auth, params={"workflow": wid})
    assert events and tasks
    for row in events:
        assert_shape(row, answers.EventAnswer)
    for row in tasks:
        assert_shape(row, answers.TaskRowAnswer)
    for row in answer(client, "GET", "/api/pool", auth):
        assert_shape(row, answers.PoolAnswer)
    for row in answer(client, "GET", "/api/resource", auth):
        assert_shape(row, answers.ResourceAnswer)
    assert_shape(answer(client, "POST", "/api/pool/reload", auth), answers.PoolReloadAnswer)
    assert_shape(answer(client, "GET", "/api/whoami", auth), answers.WhoamiAnswer)
    assert_shape(answer(client, "GET", "/api/version", auth), answers.VersionAnswer)
    assert_shape(answer(client, "GET", "/api/health", {}), answers.HealthAnswer)
    assert_shape(answer(client, "POST", "/api/login-link", auth), answers.LoginLinkAnswer)
    checked = answer(client, "POST", "/api/workflow/validate", auth, json={"spec_text": HELLO})
    assert_shape(checked, answers.ValidateAnswer)
    tagged = answer(client, "POST", "/api/tag", auth, json={"workflows": [wid], "add": ["x"]})
    assert_shape(tagged[0], answers.TagAnswer)
    assert_shape(answer(client, "POST", f"/api/workflow/{wid}/cancel", auth), answers.CancelAnswer)
    set_ = answer(client, "POST", "/api/credentials/c", auth, json={"payload": {"k": "v"}})
    assert_shape(set_, answers.CredentialAnswer)
    assert_shape(answer(client, "GET", "/api/credentials", auth)[0], answers.CredentialAnswer)
    assert_shape(answer(client, "DELETE", "/api/credentials/c", auth), answers.DeletedAnswer)
    pruned = answer(
        client, "POST", "/api/workflow/prune", auth, json={"older_than_s": 0, "dry_run": True}
    )
    assert_shape(pruned, answers.PruneAnswer)
    deleted = answer(client, "POST", "/api/workflow/delete", auth, json={"ids": [wid]})
    assert_shape(deleted, answers.DeleteAnswer)


def test_each_token_and_user_answer_has_its_typed_shape(api: tuple[TestClient, dict]) -> None:
    client, auth = api
    made = answer(client, "POST", "/api/token", auth, json={"name": "t1"})
    assert_shape(made, answers.NewTokenAnswer)
    for row in answer(client, "GET", "/api/token", auth):
        assert_shape(row, answers.TokenAnswer)
    assert_shape(answer(client, "GET", "/api/token/t1/roles", auth), answers.TokenRolesAnswer)
    assert_shape(answer(client, "DELETE", "/api/token/t1", auth), answers.TokenDeletedAnswer)
    user = answer(client, "POST", "/api/user", auth, json={"user": "ana"})
    assert_shape(user, answers.NewUserAnswer)
    for row in answer(client, "GET", "/api/user", auth):
        assert_shape(row, answers.UserAnswer)
    assert_shape(answer(client, "GET", "/api/user/ana", auth), answers.UserInfoAnswer)
    changed = answer(client, "PATCH", "/api/user/ana", auth, json={"add": ["osmo-admin"]})
    assert_shape(changed, answers.UserInfoAnswer)
    assert_shape(answer(client, "DELETE", "/api/user/ana", auth), answers.UserDeletedAnswer)


def test_each_app_answer_has_its_typed_shape(api: tuple[TestClient, dict]) -> None:
    client, auth = api
    made = answer(client, "POST", "/api/app/greeter", auth, json={"spec_text": HELLO})
    assert_shape(made, answers.AppAnswer)
    assert_shape(answer(client, "GET", "/api/app", auth)[0], answers.AppAnswer)
    assert_shape(answer(client, "GET", "/api/app/greeter", auth), answers.AppAnswer)
    assert_shape(answer(client, "GET", "/api/app/greeter/versions", auth)[0], answers.AppAnswer)
    renamed = answer(client, "POST", "/api/app/greeter/rename", auth, json={"new_name": "hi"})
    assert_shape(renamed, answers.AppRenamedAnswer)
    assert_shape(answer(client, "DELETE", "/api/app/hi", auth), answers.AppDeletedAnswer)


def _done(client: TestClient, auth: dict[str, str], workflow_id: str) -> None:
    for _ in range(400):
        if answer(client, "GET", f"/api/workflow/{workflow_id}", auth)["status"] == "COMPLETED":
            return
    raise AssertionError(f"{workflow_id} did not complete")


def test_each_submit_diff_and_metrics_answer_has_its_typed_shape(
    api: tuple[TestClient, dict],
) -> None:
    client, auth = api
    body = {"spec_text": HELLO}
    made = answer(client, "POST", "/api/workflow", auth, json=body)
    assert_shape(made, answers.SubmitAnswer)
    dry = answer(client, "POST", "/api/workflow", auth, json=body, params={"dry_run": True})
    assert_shape(dry, answers.DryRunAnswer)
    for row in dry["backend"]:
        assert_shape(row, answers.BackendShown)
    wid = made["id"]
    _done(client, auth, wid)
    again = answer(client, "POST", f"/api/workflow/{wid}/resubmit", auth)
    assert_shape(again, answers.SubmitAnswer)
    dry_again = answer(
        client, "POST", f"/api/workflow/{wid}/resubmit", auth, params={"dry_run": True}
    )
    assert_shape(dry_again, answers.DryRunAnswer)
    answer(client, "POST", "/api/app/greeter", auth, json=body)
    from_app = answer(client, "POST", "/api/app/greeter/submit", auth, json={"spec_text": ""})
    assert_shape(from_app, answers.SubmitAnswer)
    dry_app = answer(
        client,
        "POST",
        "/api/app/greeter/submit",
        auth,
        json={"spec_text": ""},
        params={"dry_run": True},
    )
    assert_shape(dry_app, answers.DryRunAnswer)
    _done(client, auth, again["id"])
    diff = answer(client, "GET", f"/api/workflow/{wid}/diff/{again['id']}", auth)
    assert_shape(diff, answers.DiffAnswer)
    for row in diff["differences"]:
        assert_shape(row, answers.DiffSetting)
    for row in diff["metrics"]:
        assert_shape(row, answers.DiffMetric)
    for row in diff["models"]:
        assert_shape(row, answers.DiffModel)
    assert_shape(answer(client, "GET", f"/api/workflow/{wid}/metrics", auth), answers.MetricsAnswer)
