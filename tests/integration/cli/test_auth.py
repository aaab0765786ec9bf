"""Tokens over real HTTP (httpx) against the session's server: no or a wrong token is 401,
another user's workflow is 403, an admin sees everything; ``trainyard server add-user``
works on the running server at once."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from cli_e2e_support import Server

SPEC = """
workflow:
  name: {{ owner }}-work
  tasks:
  - name: t
    command: [echo, "owned by {{ owner }}"]
default-values:
  owner: nobody
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def users(server: Server) -> dict[str, str]:
    """Tokens of admin (the server's owner), bob and carol, added with the CLI."""
    tokens = {"admin": server.token}
    for name in ("bob", "carol"):
        added = server.cli("server", "add-user", name)
        assert added.code == 0, added.err
        tokens[name] = added.out.strip()
    return tokens


def submit_as(server: Server, token: str, owner: str) -> str:
    answer = httpx.post(
        f"{server.url}/api/workflow",
        headers=bearer(token),
        json={"spec_text": SPEC, "set": [f"owner={owner}"]},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


@pytest.mark.parametrize(
    "headers",
    [{}, bearer("wrong"), {"Authorization": "Basic abc"}],
    ids=["none", "wrong", "not-bearer"],
)
def test_no_or_wrong_token_is_401(server: Server, headers: dict[str, str]) -> None:
    for method, path in (
        ("GET", "/api/workflow"),
        ("GET", "/api/pool"),
        ("POST", "/api/workflow"),
        ("GET", "/api/version"),
    ):
        answer = httpx.request(method, f"{server.url}{path}", headers=headers, json={}, timeout=30)
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json()["kind"] == "AuthError"
    assert httpx.get(f"{server.url}/api/health", timeout=30).status_code == 200


def test_a_wrong_token_through_the_cli_exits_8(server: Server) -> None:
    got = server.cli("workflow", "list", TRAINYARD_TOKEN="wrong")
    assert got.code == 8 and got.err.strip() == "error: unknown token"


def test_another_users_workflow_is_403(server: Server, users: dict[str, str]) -> None:
    bobs = submit_as(server, users["bob"], "bob")
    server.wait(bobs)
    carol = bearer(users["carol"])
    for method, path in (
        ("GET", f"/api/workflow/{bobs}"),
        ("GET", f"/api/workflow/{bobs}/logs"),
        ("POST", f"/api/workflow/{bobs}/cancel"),
        ("POST", f"/api/workflow/{bobs}/restart"),
        ("POST", f"/api/workflow/{bobs}/resubmit"),
    ):
        answer = httpx.request(method, f"{server.url}{path}", headers=carol, timeout=30)
        assert answer.status_code == 403, (path, answer.text)
        assert "belongs to bob" in answer.json()["detail"][0]["message"]
    got = server.cli("workflow", "logs", bobs, TRAINYARD_TOKEN=users["carol"])
    assert got.code == 8 and "belongs to bob" in got.err
    mine = httpx.get(
        f"{server.url}/api/workflow/{bobs}/logs", headers=bearer(users["bob"]), timeout=30
    )
    assert mine.status_code == 200 and "owned by bob" in mine.text


def test_users_list_only_their_own_and_an_admin_sees_all(
    server: Server, users: dict[str, str]
) -> None:
    bobs = submit_as(server, users["bob"], "bob")
    carols = submit_as(server, users["carol"], "carol")

    def listed(token: str) -> set[str]:
        answer = httpx.get(f"{server.url}/api/workflow", headers=bearer(token), timeout=30)
        assert answer.status_code == 200
        return {w["id"] for w in answer.json()}

    assert bobs in listed(users["bob"]) and carols not in listed(users["bob"])
    assert carols in listed(users["carol"]) and bobs not in listed(users["carol"])
    assert {bobs, carols} <= listed(users["admin"])
    assert {bobs, carols} <= server.ids()  # the CLI uses the admin token of the home (-a)
    mine = {w["id"] for w in server.main("workflow", "list", "-t", "json").json()}
    assert not {bobs, carols} & mine  # without -a, as OSMO's: the caller's own
    shown = server.query(carols)
    assert shown["submitted_by"] == "carol"
    cancel = httpx.post(
        f"{server.url}/api/workflow/{carols}/cancel", headers=bearer(users["admin"]), timeout=30
    )
    assert cancel.status_code == 200
    server.wait(bobs)
    server.wait(carols)


def test_only_an_apps_owner_or_an_admin_may_change_or_delete_it(
    server: Server, users: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "app.yaml"
    path.write_text(SPEC)
    bob, carol = {"TRAINYARD_TOKEN": users["bob"]}, {"TRAINYARD_TOKEN": users["carol"]}
    made = server.cli("app", "create", "bobs-app", str(path), **bob)
    assert made.code == 0, made.err
    for args in (("app", "delete", "bobs-app"), ("app", "create", "bobs-app", str(path))):
        refused = server.cli(*args, **carol)
        assert refused.code == 8 and "app bobs-app belongs to bob" in refused.err, refused.err
    assert server.cli("app", "create", "bobs-app", str(path), **bob).code == 0  # version 2
    assert server.cli("app", "create", "bobs-app", str(path)).code == 0  # the admin: 3
    listed = {a["name"]: a for a in server.main("app", "list", "-t", "json").json()}
    assert (listed["bobs-app"]["version"], listed["bobs-app"]["owner"]) == (3, "bob")
    gone = server.cli("app", "delete", "bobs-app")  # the admin
    assert (gone.code, gone.out.strip()) == (0, "App bobs-app deleted (3 versions)"), gone.err
