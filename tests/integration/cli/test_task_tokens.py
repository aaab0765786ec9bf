"""Task tokens against the real server with real tasks (issue 11, "nothing of trainyard's
state inside the sandbox"): a task's own CLI gets a token scoped to its workflow and its
submitter that expires with the workflow; with it, a task cannot cancel another user's
workflow (the attack that was seen, with the admin token from ``tokens.json``), nor submit,
nor act as an admin; the token is not shown in ``workflow query`` or the logs, and run.json
that holds it is 0600."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import httpx
import pytest
from cli_e2e_support import SPECS, Server

SLEEPER = """
workflow:
  name: victim
  tasks:
  - name: t
    command: [sleep, "300"]
"""

ATTACKER = """
workflow:
  name: attacker
  tasks:
  - name: t
    command: [sh, -c]
    args:
    - |
      trainyard workflow cancel {{ victim }}; echo "cancel-exit=$?"
      trainyard workflow query {{ victim }} -t json > /dev/null; echo "query-other-exit=$?"
      trainyard workflow query {{workflow_id}} -t json > /dev/null; echo "query-own-exit=$?"
      trainyard workflow logs {{workflow_id}} > /dev/null; echo "logs-own-exit=$?"
      case "$TRAINYARD_TOKEN" in tyt1.*) echo "token-kind=task";; *) echo "token-kind=other";; esac
default-values:
  victim: none
"""


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def users(server: Server) -> dict[str, str]:
    tokens = {}
    for name in ("tok-bob", "tok-carol"):
        added = server.cli("server", "add-user", name)
        assert added.code == 0, added.err
        tokens[name] = added.out.strip()
    return tokens


def submit(server: Server, token: str, text: str, tmp_path: Path, *sets: str) -> str:
    path = tmp_path / f"spec-{time.monotonic_ns()}.yaml"
    path.write_text(text)
    args = ["workflow", "submit", str(path), "-t", "json"]
    if sets:
        args += ["--set", *sets]
    done = server.cli(*args, TRAINYARD_TOKEN=token)
    assert done.code == 0, done.err
    return json.loads(done.out)["id"]


def run_json_of(server: Server, workflow_id: str, task: str = "t") -> Path:
    return server.home / "runs" / workflow_id / task / "0" / "run.json"


def task_token(server: Server, workflow_id: str) -> str:
    path = run_json_of(server, workflow_id)
    deadline = time.monotonic() + 60
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.2)
    return json.loads(path.read_text())["sandbox"]["env"]["TRAINYARD_TOKEN"]


def test_a_task_cannot_cancel_another_users_workflow(
    server: Server, users: dict[str, str], tmp_path: Path
) -> None:
    victim = submit(server, users["tok-bob"], SLEEPER, tmp_path)
    attack = submit(server, users["tok-carol"], ATTACKER, tmp_path, f"victim={victim}")
    done = server.wait(attack)
    logs = server.logs(attack)
    assert done["status"] == "COMPLETED", logs
    assert "cancel-exit=8" in logs and "query-other-exit=8" in logs, logs
    assert "query-own-exit=0" in logs and "logs-own-exit=0" in logs, logs
    assert "token-kind=task" in logs, logs
    assert server.query(victim)["status"] == "RUNNING"
    server.main("workflow", "cancel", victim)
    server.wait(victim)


def test_the_task_token_is_scoped_to_its_workflow_and_expires_with_it(
    server: Server, users: dict[str, str], tmp_path: Path
) -> None:
    bobs = submit(server, users["tok-bob"], SLEEPER, tmp_path)
    carols = submit(server, users["tok-carol"], SLEEPER, tmp_path)
    server.wait_task(carols, "t", "RUNNING")
    token = task_token(server, carols)
    assert token.startswith("tyt1.") and token not in (users["tok-carol"], server.token)
    api = server.url
    own = httpx.get(f"{api}/api/workflow/{carols}", headers=bearer(token), timeout=30)
    assert own.status_code == 200 and own.json()["submitted_by"] == "tok-carol"
    listed = httpx.get(f"{api}/api/workflow", headers=bearer(token), timeout=30).json()
    assert [w["id"] for w in listed] == [carols]
    for method, path in (
        ("GET", f"/api/workflow/{bobs}"),
        ("POST", f"/api/workflow/{bobs}/cancel"),
        ("POST", f"/api/workflow/{carols}/cancel"),
        ("POST", "/api/workflow"),
        ("POST", f"/api/workflow/{carols}/resubmit"),
        ("DELETE", "/api/app/x"),
    ):
        body = {"spec_text": SLEEPER} if path == "/api/workflow" else None
        answer = httpx.request(method, f"{api}{path}", headers=bearer(token), json=body, timeout=30)
        assert answer.status_code == 403, (method, path, answer.text)
    refused = server.cli("workflow", "cancel", bobs, TRAINYARD_TOKEN=token)
    assert refused.code == 8 and "task token" in refused.err, refused.err
    forged = token[:-4] + ("0000" if not token.endswith("0000") else "1111")
    assert (
        httpx.get(f"{api}/api/workflow/{carols}", headers=bearer(forged), timeout=30).status_code
        == 401
    )
    shown = server.main("workflow", "query", carols, "--verbose", "-t", "json")
    assert token not in shown.out
    assert stat.S_IMODE(run_json_of(server, carols).stat().st_mode) == 0o600
    for workflow_id in (bobs, carols):
        server.main("workflow", "cancel", workflow_id)
        server.wait(workflow_id)
    after = httpx.get(f"{api}/api/workflow/{carols}", headers=bearer(token), timeout=30)
    assert after.status_code == 401 and "ended" in after.text, after.text
    expired = server.cli("workflow", "query", carols, TRAINYARD_TOKEN=token)
    assert expired.code == 8, expired.err
    assert token not in server.logs(carols)
    assert token not in (server.home / "server.log").read_text()


@pytest.mark.skipif(not SPECS.is_dir(), reason=f"OSMO specs not found at {SPECS}")
def test_osmo_client_spec_works_inside_a_task_with_its_task_token(
    server: Server, users: dict[str, str]
) -> None:
    done = server.cli(
        "workflow",
        "submit",
        str(SPECS / "tests/osmo_client_test.yaml"),
        "--wait",
        "-t",
        "json",
        TRAINYARD_TOKEN=users["tok-bob"],
    )
    final = json.loads(done.out)
    assert done.code == 0 and final["status"] == "COMPLETED", done.err
    logs = server.logs(final["id"])
    assert "[task1] server 0.1.0 at http://127.0.0.1:" in logs, logs
    env = json.loads(run_json_of(server, final["id"], "task1").read_text())["sandbox"]["env"]
    assert env["TRAINYARD_TOKEN"].startswith(f"tyt1.{final['id']}.")
