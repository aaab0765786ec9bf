"""``trainyard workflow logs|query|cancel|restart|submit`` against the real server, with small
specs of our own (seconds each)."""

from __future__ import annotations

import contextlib
import json
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from cli_e2e_support import Server, run_cli, wait_gone

LOGS = """
workflow:
  name: logs-demo
  tasks:
  - name: talker
    command: [sh, -c]
    args: ["for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done"]
  - name: other
    command: [sh, -c]
    args: ["echo other says hi"]
"""
FLAKY = """
workflow:
  name: flaky
  tasks:
  - name: flaky
    command: [sh, -c]
    args: ['echo "attempt $TRAINYARD_RETRY_ID"; [ "$TRAINYARD_RETRY_ID" -ge 1 ] || exit 3']
    exitActions:
      RESCHEDULE: 3
"""
FAILING = """
workflow:
  name: failing
  tasks:
  - name: boom
    command: [sh, -c]
    args: ["echo about to fail; exit 7"]
"""
SLEEPER = """
workflow:
  name: sleeper
  resources:
    default:
      cpu: 1
      memory: 1Gi
  groups:
  - name: gang
    tasks:
    - name: lead
      lead: true
      command: [sh, -c]
      args: ["echo lead up; sleep 600"]
    - name: worker
      command: [sh, -c]
      args: ["echo worker up; sleep 600 & wait"]
"""
TEMPLATE = """
workflow:
  name: "{{ name }}"
  tasks:
  - name: say
    command: [echo]
    args: ["message={{ msg }}"]
default-values:
  name: templated
  msg: default
"""
RESTARTABLE = """
workflow:
  name: restartable
  tasks:
  - name: first
    command: [sh, -c]
    args: ["echo first done > {{output}}/done.txt"]
  - name: second
    command: [sh, -c]
    args: ['cat {{input:0}}/done.txt; [ "$TRAINYARD_RETRY_ID" -ge 1 ]']
    inputs:
    - task: first
"""


def spec(tmp_path: Path, text: str, name: str = "spec.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return str(path)


def tasks_of(data: dict) -> dict[str, dict]:
    return {t["name"]: t for g in data["groups"] for t in g["tasks"]}


def test_logs_during_and_after_a_run_by_task_and_last_lines(server: Server, tmp_path: Path) -> None:
    workflow_id = server.submit(spec(tmp_path, LOGS))
    server.wait_task(workflow_id, "talker", "RUNNING")
    deadline = time.monotonic() + 30
    while "[talker] line 1" not in (during := server.logs(workflow_id, "--no-follow")):
        assert time.monotonic() < deadline, during
        time.sleep(0.2)
    assert server.query(workflow_id)["status"] == "RUNNING"
    assert "[talker] line 6" not in during

    followed = server.logs(
        workflow_id, "--task", "talker"
    )  # follows by default; returns at the end
    assert [f"line {i}" in followed for i in range(1, 7)] == [True] * 6
    assert followed.rstrip().endswith("[talker][trainyard] exit code 0")
    assert server.wait(workflow_id)["status"] == "COMPLETED"

    after = server.logs(workflow_id)
    assert "[talker] line 6" in after and "[other] other says hi" in after
    only_other = server.logs(workflow_id, "--task", "other")
    assert "other says hi" in only_other and "[talker]" not in only_other
    last_two = server.logs(workflow_id, "-n", "2")
    assert last_two.splitlines() == after.splitlines()[-2:]
    assert server.logs(workflow_id, "--follow", "-n", "2") == last_two  # -n, then follow
    rows = [
        json.loads(line) for line in server.logs(workflow_id, "--format-type", "json").splitlines()
    ]
    assert len(rows) == len(after.splitlines())
    assert {"time", "task", "retry_id", "line", "source", "cut"} == set(rows[0])
    assert {
        "time": rows[-1]["time"],
        "task": "talker",
        "retry_id": 0,
        "line": "[trainyard] exit code 0",
        "source": "runner",
        "cut": False,
    } in rows
    assert any(r["task"] == "other" and r["line"] == "other says hi" for r in rows)
    assert all(r["time"].endswith("+00:00") for r in rows)
    assert (
        server.logs(workflow_id, "--task", "talker", "-n", "1")
        .rstrip()
        .endswith("[talker][trainyard] exit code 0")
    )


def test_logs_after_a_failure_and_wait_exit_status(server: Server, tmp_path: Path) -> None:
    got = server.main("workflow", "submit", spec(tmp_path, FAILING), "--wait")
    assert got.code == 1, got.out + got.err
    workflow_id = got.out.split("Workflow submitted: ")[1].split()[0]
    assert "boom FAILED" in got.out and "(exit 7)" in got.out
    logs = server.logs(workflow_id)
    assert "[boom] about to fail" in logs and "[boom][trainyard] exit code 7" in logs
    assert server.query(workflow_id)["status"] == "FAILED"


def test_query_verbose_lists_retries_and_logs_pick_one(server: Server, tmp_path: Path) -> None:
    got = server.main("workflow", "submit", spec(tmp_path, FLAKY), "--wait")
    assert got.code == 0, got.out + got.err
    workflow_id = got.out.split("Workflow submitted: ")[1].split()[0]
    task = tasks_of(server.query(workflow_id, verbose=True))["flaky"]
    assert (task["status"], task["retry_id"]) == ("COMPLETED", 1)
    assert task["exit_code"] == 0
    # ``retries``: the earlier attempts; the task's own fields are the current one.
    assert [(r["retry_id"], r["exit_code"]) for r in task["retries"]] == [(0, 3)]
    assert task["retries"][0]["status"] == "RESCHEDULED"
    assert "retries" not in tasks_of(server.query(workflow_id))["flaky"]
    table = server.main("workflow", "query", workflow_id, "--verbose")
    assert table.code == 0 and "retry 0" in table.out and "RESCHEDULED" in table.out

    first = server.logs(workflow_id, "--retry-id", "0")
    assert "attempt 0" in first and "attempt 1" not in first
    assert "attempt 1" in server.logs(workflow_id, "--retry-id", "1")
    both = server.logs(workflow_id)
    assert both.index("attempt 0") < both.index("attempt 1")


def _task_processes(server: Server, workflow_id: str, task: str) -> list[psutil.Process]:
    """The task's runner process (none when a thread of the launcher hosts it) and every
    process with the task's identity in its environment (its command and what it started)."""
    launch = json.loads(
        (server.home / "runs" / workflow_id / task / "0" / "launch.json").read_text()
    )
    found = [] if launch.get("hosted_by") else [psutil.Process(launch["pid"])]
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            if (env.get("TRAINYARD_WORKFLOW_ID"), env.get("TRAINYARD_TASK_NAME")) == (
                workflow_id,
                task,
            ):
                found.append(proc)
    return found


def test_cancel_stops_every_process_and_ends_failed_canceled(
    server: Server, tmp_path: Path
) -> None:
    workflow_id = server.submit(spec(tmp_path, SLEEPER))
    for task in ("lead", "worker"):
        server.wait_task(workflow_id, task, "RUNNING")
    procs = [p for t in ("lead", "worker") for p in _task_processes(server, workflow_id, t)]
    assert any("sleep" in " ".join(p.cmdline()) for p in procs)
    rows = [r for r in server.main("resource", "list", "--pool", "local", "-t", "json").json()]
    assert sum(r["used"]["cpu"] for r in rows) >= 2  # other tests' tasks may run too
    assert sum(r["used"]["memory_bytes"] for r in rows) >= 2 * 2**30

    running = server.main("workflow", "restart", workflow_id)
    assert running.code == 4 and "RUNNING" in running.err, running.err  # refused, not exit 7
    got = server.cli("workflow", "cancel", workflow_id)
    assert got.code == 0, got.err
    assert f"Workflow {workflow_id} cancel requested" in got.out
    final = server.wait(workflow_id, timeout_s=60)
    assert final["status"] == "FAILED_CANCELED"
    assert all(t["status"].startswith("FAILED") for t in tasks_of(final).values())
    left = wait_gone(procs, timeout_s=30)
    assert not left, [p.cmdline() for p in left]
    again = server.main("workflow", "cancel", workflow_id, "-t", "json")
    assert again.code == 4, again.err  # it had ended: said so, nothing changed
    assert json.loads(again.out)["status"] == "FAILED_CANCELED"
    assert json.loads(again.out)["had_ended"] is True


def test_submit_a_workflow_id_resubmits_its_stored_spec(server: Server, tmp_path: Path) -> None:
    spec_file = spec(tmp_path, TEMPLATE)
    first = server.submit(spec_file, "--set", "name=resub", "msg=kept")
    Path(spec_file).unlink()  # the stored spec is used, not the file
    before = server.ids()
    dry = server.cli("workflow", "submit", first, "--set", "msg=dry", "--dry-run")
    assert dry.code == 0, dry.err
    assert 'args: ["message=dry"]' in dry.out and 'name: "resub"' in dry.out
    dry_json = server.main("workflow", "submit", first, "--dry-run", "-t", "json").json()
    assert dry_json["dry_run"] is True and 'args: ["message=kept"]' in dry_json["spec"]
    assert server.ids() == before  # a dry run of a stored workflow creates nothing
    second = server.cli("workflow", "submit", first, "--wait", "-t", "json")
    final = second.json()  # stdout is one JSON document: the final query object
    second_id = final["id"]
    assert final["status"] == "COMPLETED" and final["groups"][0]["tasks"][0]["name"] == "say"
    assert f"Workflow {second_id} COMPLETED after" in second.err  # progress on stderr
    assert second_id != first and second_id.startswith("resub-")
    assert "message=kept" in server.logs(second_id)
    third = server.main("workflow", "submit", first, "--set", "msg=override", "--wait")
    assert third.code == 0, third.err
    third_id = third.out.split("Workflow submitted: ")[1].split()[0]
    assert "message=override" in server.logs(third_id)
    assert server.wait(first)["status"] == "COMPLETED"


def test_dry_run_prints_the_rendered_spec_and_creates_nothing(
    server: Server, tmp_path: Path
) -> None:
    before = server.ids()
    got = server.cli(
        "workflow", "submit", spec(tmp_path, TEMPLATE), "--set", "msg=dry", "--dry-run"
    )
    assert got.code == 0, got.err
    assert 'args: ["message=dry"]' in got.out and 'name: "templated"' in got.out
    as_json = server.main("workflow", "submit", spec(tmp_path, TEMPLATE), "--dry-run", "-t", "json")
    assert as_json.json()["dry_run"] is True and as_json.json()["name"] == "templated"
    assert server.ids() == before


def test_restart_runs_the_failed_part_again(server: Server, tmp_path: Path) -> None:
    got = server.main("workflow", "submit", spec(tmp_path, RESTARTABLE), "--wait")
    assert got.code == 1, got.out + got.err
    workflow_id = got.out.split("Workflow submitted: ")[1].split()[0]
    restarted = server.main("workflow", "restart", workflow_id, "--wait")
    assert restarted.code == 0, restarted.out + restarted.err
    tasks = tasks_of(server.query(workflow_id))
    assert (tasks["first"]["status"], tasks["first"]["retry_id"]) == ("COMPLETED", 0)
    assert (tasks["second"]["status"], tasks["second"]["retry_id"]) == ("COMPLETED", 1)
    assert "first done" in server.logs(workflow_id, "--task", "second", "--retry-id", "1")
    again = server.main("workflow", "restart", workflow_id)
    assert again.code == 4 and "COMPLETED" in again.err  # a refused request, not exit 7


@pytest.mark.parametrize("command", [("query",), ("logs",), ("cancel",), ("restart",), ("submit",)])
def test_unknown_workflow_id_exits_3_and_says_what_to_do(server: Server, command: tuple) -> None:
    got = server.main("workflow", *command, "nope-404")
    assert got.code == 3, got.out + got.err
    assert got.err.startswith("error: ") and "nope-404" in got.err
    assert "trainyard workflow list" in got.err


NEEDS_OSMO = """
workflow:
  name: needs-osmo
  resources: {default: {gpu: 8, platform: dgx-h100}}
  tasks:
  - name: t
    command: [echo, "{{ msg }}"]
default-values:
  msg: hi
"""


def test_validate_and_spec_ask_the_configured_server(server: Server, tmp_path: Path) -> None:
    """A home without pools.yaml, pointed at the session's server (whose pools.yaml has the
    pool 'osmo'): the server's pools decide; --local checks against this machine's."""
    home = tmp_path / "client home"
    home.mkdir()
    env = {"TRAINYARD_SERVER_URL": server.url, "TRAINYARD_TOKEN": server.token}
    path = spec(tmp_path, NEEDS_OSMO)
    got = run_cli(home, "workflow", "validate", path, "--pool", "osmo", "-t", "json", **env)
    assert got.json() == {
        "valid": True,
        "name": "needs-osmo",
        "pool": "osmo",
        "server": server.url,
        "warnings": [],
    }
    rendered = run_cli(home, "workflow", "spec", path, "--pool", "osmo", "--set", "msg=yo", **env)
    assert rendered.code == 0 and 'command: [echo, "yo"]' in rendered.out, rendered.err
    local = run_cli(home, "workflow", "validate", path, "--pool", "osmo", "--local", **env)
    assert local.code == 3 and "unknown pool 'osmo'; pools: local" in local.err
    assert not (home / "server.json").exists()  # nothing was started here


def test_a_running_local_server_checks_with_the_same_messages(
    server: Server, tmp_path: Path
) -> None:
    path = spec(tmp_path, NEEDS_OSMO.replace("platform: dgx-h100", "platform: nope"))
    remote = server.main("workflow", "validate", path, "--pool", "osmo")
    local = server.main("workflow", "validate", path, "--pool", "osmo", "--local")
    assert remote.code == local.code == 2
    assert remote.err == local.err
    assert remote.err.startswith(f"{path}:3: workflow.resources.default.platform: ")
    ok = server.main(
        "workflow",
        "validate",
        spec(tmp_path, NEEDS_OSMO, "ok.yaml"),
        "--pool",
        "osmo",
        "-t",
        "json",
    ).json()
    assert ok["server"] == server.url


def test_submit_of_a_missing_file_says_the_file_does_not_exist(server: Server) -> None:
    got = server.main("workflow", "submit", "typo.yaml")
    assert (got.code, got.out) == (2, "")
    assert got.err.startswith("typo.yaml: no such spec file; check the path")


def test_list_refuses_a_bogus_status_and_a_count_below_1(server: Server) -> None:
    bogus = server.cli("workflow", "list", "--status", "BOGUS")
    assert bogus.code == 2 and "FAILED_CANCELED" in bogus.err
    assert server.cli("workflow", "list", "--count", "0").code == 2
    assert server.cli("workflow", "list", "--count", "-1").code == 2
    assert server.main("workflow", "list", "--status", "completed", "-c", "1").code == 0
