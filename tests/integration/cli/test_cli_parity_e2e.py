"""OSMO parity of the CLI (issue 13) against the session's real server: logs follow by
default, --error and -r; cancel of several and of an ended one; list filters; events; task
list; --wait's failure hint; pools.yaml edits without a restart."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import httpx
from cli_e2e_support import Server

FLAKY_AND_FINE = """
workflow:
  name: parity-flaky
  labels: {team: vision}
  tasks:
  - name: flaky
    command: [sh, -c]
    args: ['echo "attempt $TRAINYARD_RETRY_ID"; [ "$TRAINYARD_RETRY_ID" -ge 1 ] || exit 3']
    exitActions:
      RESCHEDULE: 3
  - name: fine
    command: [sh, -c]
    args: ["echo fine here"]
"""
SLOW = """
workflow:
  name: parity-slow
  tasks:
  - name: talker
    command: [sh, -c]
    args: ["for i in 1 2 3 4; do echo tick $i; sleep 0.5; done"]
"""
SLEEPY = """
workflow:
  name: parity-sleepy
  tasks:
  - name: nap
    command: [sleep, "600"]
"""
FAILING = """
workflow:
  name: parity-failing
  tasks:
  - name: boom
    command: [sh, -c]
    args: ["echo about to fail; exit 7"]
"""


def spec(tmp_path: Path, text: str, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def test_logs_follow_by_default_error_and_retry_id(server: Server, tmp_path: Path) -> None:
    slow = server.submit(spec(tmp_path, SLOW, "slow"))
    server.wait_task(slow, "talker", "RUNNING")
    followed = server.logs(slow)  # no flag: follows until the workflow ends
    assert "[talker] tick 4" in followed
    assert followed.rstrip().endswith("[talker][trainyard] exit code 0")
    assert server.query(slow)["status"] == "COMPLETED"

    flaky = server.submit(spec(tmp_path, FLAKY_AND_FINE, "flaky"))
    assert server.wait(flaky)["status"] == "COMPLETED"
    errors = server.logs(flaky, "--error")  # only the attempt that failed (retry 0 of flaky)
    assert "[flaky] attempt 0" in errors and "exit code 3" in errors
    assert "attempt 1" not in errors and "fine here" not in errors
    assert "attempt 1" in server.logs(flaky, "-r", "1", "--task", "flaky")

    events = server.main("workflow", "events", flaky, "--format-type", "json").json()
    flaky_events = [(e["retry_id"], e["event"]) for e in events if e["task"] == "flaky"]
    assert (0, "RESCHEDULED") in flaky_events and (1, "COMPLETED") in flaky_events
    assert flaky_events.index((0, "RESCHEDULED")) < flaky_events.index((1, "COMPLETED"))
    table = server.main("workflow", "events", flaky)
    assert table.code == 0 and "RESCHEDULED" in table.out
    query = server.main("workflow", "query", flaky)
    assert "Labels: team=vision" in query.out

    tasks = server.main("task", "list", flaky, "-t", "json").json()
    assert {(t["name"], t["status"], t["retry_id"]) for t in tasks} == {
        ("flaky", "COMPLETED", 1),
        ("fine", "COMPLETED", 0),
    }
    mine = server.main("task", "list", "-c", "1", "-t", "json").json()
    assert {t["workflow"] for t in mine} == {flaky}


def test_cancel_several_then_again_says_ended(server: Server, tmp_path: Path) -> None:
    ids = [server.submit(spec(tmp_path, SLEEPY, "sleepy")) for _ in range(2)]
    got = server.main("workflow", "cancel", *ids)
    assert got.code == 0, got.err
    assert [f"Workflow {i} cancel requested" in got.out for i in ids] == [True, True]
    for workflow_id in ids:
        assert server.wait(workflow_id, timeout_s=60)["status"] == "FAILED_CANCELED"
    again = server.main("workflow", "cancel", ids[0], "nope-404")
    assert again.code == 4
    assert f"Workflow {ids[0]} had already ended: FAILED_CANCELED" in again.err
    assert "error: workflow nope-404" in again.err


def test_list_filters(server: Server, tmp_path: Path) -> None:
    before = time.time()
    time.sleep(1.1)  # submit times are compared to the second's ISO time below
    first = server.submit(spec(tmp_path, SLOW, "slow"))
    second = server.submit(spec(tmp_path, FAILING, "failing"))

    def listed(*args: str) -> list[str]:
        return [w["id"] for w in server.main("workflow", "list", *args, "-t", "json").json()]

    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before + 1))  # > before, < submits
    assert listed("--submitted-after", since) == [second, first]
    assert listed("--submitted-after", since, "--order", "asc") == [first, second]
    assert listed("--submitted-after", since, "--offset", "1") == [first]
    assert listed("--submitted-before", since, "--name", "parity-failing") == []
    me = httpx.get(
        f"{server.url}/api/whoami", timeout=30, headers={"Authorization": f"Bearer {server.token}"}
    ).json()["user"]
    assert listed("--user", me, "--submitted-after", since, "--pool", "local") == [second, first]
    assert listed("--user", f"not-{me}", "--submitted-after", since) == []
    assert listed("--pool", "no-such-pool") == []
    for workflow_id in (first, second):
        server.wait(workflow_id)


def test_wait_on_failure_names_the_task_and_its_log_command(server: Server, tmp_path: Path) -> None:
    got = server.main("workflow", "submit", spec(tmp_path, FAILING, "failing"), "--wait")
    assert got.code == 1, got.err
    workflow_id = got.out.split("Workflow submitted: ")[1].split()[0]
    assert "Task boom retry 0 FAILED" in got.out
    assert f"trainyard workflow logs {workflow_id} --task boom --retry-id 0" in got.out


def test_pools_yaml_edit_applies_without_restart_and_bad_file_keeps_pools(server: Server) -> None:
    path = server.home / "pools.yaml"
    original = path.read_text()

    def touch(text: str) -> None:
        stamp = path.stat().st_mtime_ns + 10**9
        path.write_text(text)
        os.utime(path, ns=(stamp, stamp))

    def pools() -> set[str]:
        return {p["name"] for p in server.main("pool", "list", "-t", "json").json()}

    try:
        touch(original + "  parity-extra:\n    backend: local\n    node_count: 1\n")
        assert "parity-extra" in pools()
        touch("pools: [not, a, mapping")
        assert "parity-extra" in pools()  # the bad file is refused; the pools stay
        refused = server.main("pool", "reload")
        assert refused.code == 4 and "keeps serving its pools" in refused.err, refused.err
    finally:
        touch(original)
    reloaded = server.main("pool", "reload", "-t", "json").json()
    assert "parity-extra" not in reloaded["pools"] and reloaded["error"] is None
    assert json.loads(json.dumps(reloaded))["pools"] == sorted(pools())
