"""Issue 12 M2 end to end, with a server of its own: a spec over 4 MiB is refused (exit 2,
one line naming its size and the limit) by the CLI before it sends anything and by the
server (a rendered template, a raw request); a spec is stored once, and a workflow whose
server was stopped while it ran is rebuilt from that text, completes, and submits again."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cli_e2e_support import processes_of, run_cli, wait_gone

LIMIT = "over the limit of 4.0 MiB (4,194,304 bytes) of spec text"
TEMPLATE = """workflow:
  name: grows
  tasks:
  - name: t
    command: [sh, -c]
    args: ["sleep {{ nap }}; echo done {{ 'x' * n }}"]
default-values:
  nap: 0
  n: 3
"""


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A home of its own; its server is stopped afterwards and no process may outlive it."""
    home = tmp_path / "size home"
    home.mkdir()
    yield home
    run_cli(home, "server", "stop")
    assert not wait_gone(processes_of(home), timeout_s=45)


def _query(home: Path, workflow_id: str) -> dict:
    got = run_cli(home, "workflow", "query", workflow_id, "-t", "json")
    assert got.code == 0, got.err
    return json.loads(got.out)


def _wait(home: Path, workflow_id: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := _query(home, workflow_id)["status"]) not in (
        "COMPLETED",
    ) and not status.startswith("FAILED"):
        assert time.monotonic() < deadline, f"{workflow_id} still {status}"
        time.sleep(0.5)
    return status


def test_the_cli_refuses_a_big_spec_before_sending_anything(home: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(TEMPLATE.replace("n: 3", "n: 3\n  pad: '" + "y" * 5 * 2**20 + "'"))
    for command in ("submit", "validate", "spec"):
        got = run_cli(home, "workflow", command, str(big))
        assert (got.code, got.out) == (2, ""), got.err
        assert got.err == (
            f"{big}: the spec is 5.0 MiB (5,243,044 bytes), {LIMIT}; make it "
            "smaller (large data belongs in a dataset or a URL input)\n"
        )
    assert not (home / "server.json").exists()  # nothing was sent: no server was started


def test_the_server_refuses_what_grows_past_the_limit(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "grows.yaml"
    spec.write_text(TEMPLATE)
    first = run_cli(home, "workflow", "submit", str(spec), "-t", "json")
    assert first.code == 0, first.err
    workflow_id = json.loads(first.out)["id"]
    # `submit ID` sends only the new value: the server renders 5 MiB and refuses it
    grown = run_cli(home, "workflow", "submit", workflow_id, "--set", f"n={5 * 2**20}")
    assert (grown.code, grown.out) == (2, ""), grown.err
    assert grown.err == (
        f"{spec}: the rendered spec is 5.0 MiB (5,243,013 bytes), {LIMIT}; "
        "make the template build less text\n"
    )
    url = json.loads((home / "server.json").read_text())["url"]
    auth = {"Authorization": f"Bearer {(home / 'token').read_text().strip()}"}
    raw = httpx.post(
        f"{url}/api/workflow", headers=auth, timeout=60, json={"spec_text": "x" * (4 * 2**20 + 1)}
    )
    assert (raw.status_code, raw.json()["kind"]) == (422, "SpecError")
    huge = httpx.post(
        f"{url}/api/workflow", headers=auth, timeout=60, content=b"{" + b" " * 30 * 2**20 + b"}"
    )
    assert (huge.status_code, huge.json()["kind"]) == (413, "SpecError")
    listed = json.loads(run_cli(home, "workflow", "list", "-t", "json").out)
    assert [w["id"] for w in listed] == [workflow_id]  # nothing refused was stored


def test_a_spec_is_stored_once_and_a_stopped_server_resumes_from_it(
    home: Path, tmp_path: Path
) -> None:
    spec = tmp_path / "grows.yaml"
    spec.write_text(TEMPLATE)
    sent = run_cli(home, "workflow", "submit", str(spec), "--set", "nap=4", "-t", "json")
    assert sent.code == 0, sent.err
    workflow_id = json.loads(sent.out)["id"]
    deadline = time.monotonic() + 60
    while _query(home, workflow_id)["status"] != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert run_cli(home, "server", "stop").code == 0
    with sqlite3.connect(home / "trainyard.db") as db:
        text, source = db.execute(
            "select spec_text, source from workflows where id = ?", (workflow_id,)
        ).fetchone()
    assert "sleep 4; echo done xxx" in text and "spec" not in json.loads(source)
    assert source.count("echo done") == 1  # the template, kept for `submit ID --set`
    assert _wait(home, workflow_id) == "COMPLETED"  # the CLI starts a new server: it resumes
    logs = run_cli(home, "workflow", "logs", workflow_id)
    assert "done xxx" in logs.out
    again = run_cli(home, "workflow", "submit", workflow_id, "--set", "n=5", "-t", "json")
    assert again.code == 0, again.err
    assert _wait(home, json.loads(again.out)["id"]) == "COMPLETED"


def test_workflow_spec_of_an_id_prints_what_was_stored(home: Path, tmp_path: Path) -> None:
    spec = tmp_path / "grows.yaml"
    spec.write_text(TEMPLATE)
    sent = run_cli(home, "workflow", "submit", str(spec), "--set", "n=4", "-t", "json")
    workflow_id = json.loads(sent.out)["id"]
    rendered = run_cli(home, "workflow", "spec", workflow_id)
    assert rendered.code == 0, rendered.err
    assert 'args: ["sleep 0; echo done xxxx"]' in rendered.out
    assert run_cli(home, "workflow", "spec", workflow_id, "--template").out == TEMPLATE
    missing = run_cli(home, "workflow", "spec", "nope-9")
    assert missing.code == 3 and "no workflow 'nope-9'" in missing.err
    assert run_cli(home, "workflow", "spec", str(spec), "--template").code == 2
