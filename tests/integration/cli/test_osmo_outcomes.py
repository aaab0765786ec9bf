"""OSMO's "Must reach the outcome" rows (shared/osmo-specs/EXPECTATIONS.md, those that need no
object store), through ``trainyard workflow submit`` against the real server.

Every row runs as ``trainyard workflow submit ... --wait``, a real process that exits 0 only
when the workflow COMPLETED: the quick rows here, the others all started together at the
start of the session (conftest ``osmo_runs``, with ``-t json`` so that stdout is the final
workflow object) and waited on here, so this file takes little more than its longest row
(~2 minutes).
"""

from __future__ import annotations

import pytest
from cli_e2e_support import BACKGROUND_ROWS as ROWS
from cli_e2e_support import SPECS, Row, Server, WaitingSubmit

pytestmark = pytest.mark.skipif(not SPECS.is_dir(), reason=f"OSMO specs not found at {SPECS}")


def test_hello_world_with_wait_exits_0_and_logs_the_greeting(server: Server) -> None:
    done = server.cli("workflow", "submit", str(SPECS / "tutorials/hello_world.yaml"), "--wait")
    assert done.code == 0, done.out + done.err
    workflow_id = done.out.split("Workflow submitted: ")[1].split()[0]
    assert f"Workflow {workflow_id} COMPLETED" in done.out
    assert "Hello from OSMO!" in server.logs(workflow_id)


def test_template_values_from_set_reach_the_run(server: Server) -> None:
    done = server.cli(
        "workflow",
        "submit",
        str(SPECS / "tutorials/template_hello_world.yaml"),
        "--set",
        "workflow_name=greetings",
        "message=Custom message!",
        "--wait",
        "--logs",
    )
    assert done.code == 0, done.out + done.err
    assert "Custom message!" in done.out  # streamed by --logs
    workflow_id = done.out.split("Workflow submitted: ")[1].split()[0]
    assert workflow_id.startswith("greetings-")
    assert "[hello] Custom message!" in server.logs(workflow_id)


def test_exit_code_without_an_action_fails_and_wait_exits_non_zero(server: Server) -> None:
    done = server.cli(
        "workflow", "submit", str(SPECS / "tests/exit_actions.yaml"), "--set", "code=1", "--wait"
    )
    assert done.code == 1, done.out + done.err
    assert " FAILED after " in done.out


def test_the_cli_works_inside_a_task_as_osmo(server: Server) -> None:
    done = server.cli("workflow", "submit", str(SPECS / "tests/osmo_client_test.yaml"), "--wait")
    assert done.code == 0, done.out + done.err
    workflow_id = done.out.split("Workflow submitted: ")[1].split()[0]
    logs = server.logs(workflow_id)
    assert "[task1] Running osmo version" in logs
    assert "[task1] trainyard " in logs
    assert "[task1] server 0.1.0 at http://127.0.0.1:" in logs


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_reaches_its_outcome(
    row: Row, server: Server, osmo_runs: dict[str, WaitingSubmit]
) -> None:
    code, final, err = osmo_runs[row.id].result(timeout_s=300)
    assert final["status"] == row.outcome, (final, err)
    assert (code == 0) == (row.outcome == "COMPLETED"), (code, err)
    assert server.query(final["id"])["status"] == row.outcome  # what the server stored
    workflow_id = final["id"]
    logs = server.logs(workflow_id)
    for expected in row.logs:
        assert expected.format(id=workflow_id) in logs, logs


def test_lead_ending_stops_the_other_tasks(
    server: Server, osmo_runs: dict[str, WaitingSubmit]
) -> None:
    for rel in ("tests/parallel_workflow_v2.yaml", "tests/parallel_workflow_leader_exits.yaml"):
        final = osmo_runs[rel].result()[1]
        tasks = [t for g in final["groups"] for t in g["tasks"]]
        assert all(t["status"].startswith(("COMPLETED", "FAILED")) for t in tasks), tasks
        assert all(t["end_time"] for t in tasks)


def test_data_filter_takes_only_the_matching_inputs(
    server: Server, osmo_runs: dict[str, WaitingSubmit]
) -> None:
    row = next(r for r in ROWS if r.spec == "tutorials/data_filter.yaml")
    logs = server.logs(osmo_runs[row.id].workflow_id())
    assert "keep.txt" in logs
    assert "skip.json" not in logs and "skip.bin" not in logs


def test_labels_are_stored_and_filterable(
    server: Server, osmo_runs: dict[str, WaitingSubmit]
) -> None:
    ok, failed = (r for r in ROWS if r.spec == "scenarios/workflow_labels.yaml")
    ok_id, failed_id = osmo_runs[ok.id].workflow_id(), osmo_runs[failed.id].workflow_id()
    shown = server.query(ok_id)
    assert shown["labels"] == {"policy-yaml": "from-yaml", "team": "research"}
    both = server.main("workflow", "list", "--label", "policy-yaml=from-yaml", "-t", "json").json()
    assert {ok_id, failed_id} <= {w["id"] for w in both}
    only = server.main(
        "workflow", "list", "--label", "team=research", "policy-yaml=from-yaml", "-t", "json"
    ).json()
    assert [w["id"] for w in only] == [ok_id]
    assert server.main("workflow", "list", "--label", "team=nobody", "-t", "json").json() == []
