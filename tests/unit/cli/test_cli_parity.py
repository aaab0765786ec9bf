"""OSMO parity of the ``workflow`` commands (issue 13), against a fake server client: what
each command asks the server and what it prints and exits with. The real server is in
tests/integration/cli/test_cli_parity_e2e.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainyard.cli import workflow_control, workflow_ops, workflow_query
from trainyard.cli.main import main
from trainyard.errors import NotFoundError


class FakeClient:
    """Answers scripted per (method, path); records every call."""

    def __init__(
        self, answers: dict[tuple[str, str], Any] | None = None, text: list[str] | None = None
    ) -> None:
        self.answers = answers or {}
        self.text = text or []
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.token: str | None = None

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        self.calls.append((method, path, kwargs))
        answer = self.answers[(method, path)]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def stream_text(self, path: str, **params: Any) -> Iterator[str]:
        self.calls.append(("GET", path, params))
        yield from self.text


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINYARD_SERVER_URL", raising=False)
    return tmp_path / "home"


def use(monkeypatch: pytest.MonkeyPatch, client: FakeClient) -> FakeClient:
    for module in (workflow_ops, workflow_query, workflow_control):
        monkeypatch.setattr(module, "Client", lambda: client)
    return client


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------------------- logs


def test_logs_follow_by_default_and_no_follow_does_not(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = use(monkeypatch, FakeClient(text=["2026/01/01 00:00:00 [t] hi\n"]))
    assert run(capsys, "workflow", "logs", "w-1") == (0, "2026/01/01 00:00:00 [t] hi\n", "")
    assert run(capsys, "workflow", "logs", "w-1", "--no-follow")[0] == 0
    assert [c[2] for c in client.calls] == [{"follow": True}, {}]


def test_logs_error_and_short_retry_id_reach_the_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = use(monkeypatch, FakeClient())
    assert run(capsys, "workflow", "logs", "w-1", "--error", "-r", "2", "-t", "x")[0] == 0
    assert client.calls == [
        (
            "GET",
            "/api/workflow/w-1/logs",
            {"task": "x", "retry_id": 2, "error": True, "follow": True},
        )
    ]
    assert run(capsys, "workflow", "logs", "w-1", "-r", "-1")[0] == 2  # usage error


def test_logs_ctrl_c_says_the_workflow_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Interrupted(FakeClient):
        def stream_text(self, path: str, **params: Any) -> Iterator[str]:
            yield "a line\n"
            raise KeyboardInterrupt

    use(monkeypatch, Interrupted())
    code, out, err = run(capsys, "workflow", "logs", "w-1")
    assert (code, out) == (130, "a line\n")
    assert "w-1 goes on" in err


# ---------------------------------------------------------------------------- cancel


def _summary(workflow_id: str, status: str, had_ended: bool) -> dict[str, Any]:
    return {"id": workflow_id, "status": status, "had_ended": had_ended}


def test_cancel_several_prints_each_result(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    client = use(
        monkeypatch,
        FakeClient(
            {
                ("POST", "/api/workflow/a-1/cancel"): _summary("a-1", "RUNNING", False),
                ("POST", "/api/workflow/b-2/cancel"): _summary("b-2", "PENDING", False),
            }
        ),
    )
    code, out, err = run(capsys, "workflow", "cancel", "a-1", "b-2")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "Workflow a-1 cancel requested: RUNNING",
        "Workflow b-2 cancel requested: PENDING",
    ]
    assert [c[1] for c in client.calls] == ["/api/workflow/a-1/cancel", "/api/workflow/b-2/cancel"]


def test_cancel_of_an_ended_workflow_says_so_and_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(
        monkeypatch,
        FakeClient(
            {
                ("POST", "/api/workflow/a-1/cancel"): _summary("a-1", "COMPLETED", True),
                ("POST", "/api/workflow/b-2/cancel"): _summary("b-2", "RUNNING", False),
                ("POST", "/api/workflow/c-3/cancel"): NotFoundError("no workflow c-3"),
            }
        ),
    )
    code, out, err = run(capsys, "workflow", "cancel", "a-1", "b-2", "c-3")
    assert code == 4  # the first problem's code
    assert out == "Workflow b-2 cancel requested: RUNNING\n"
    assert err.splitlines() == [
        "Workflow a-1 had already ended: COMPLETED; nothing to cancel",
        "error: workflow c-3: no workflow c-3",
    ]
    code, out, _ = run(capsys, "workflow", "cancel", "c-3", "-t", "json")
    assert code == 3 and '"error": "no workflow c-3"' in out


# ---------------------------------------------------------------------------- list


def test_list_filters_reach_the_server_with_dates_in_utc(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {
        "id": "hello-osmo-12",
        "name": "hello-osmo",
        "status": "COMPLETED",
        "pool": "local",
        "submitted_by": "alice",
        "labels": {},
        "submit_time": "2026-01-31T12:00:05+00:00",
        "end_time": None,
    }
    client = use(monkeypatch, FakeClient({("GET", "/api/workflow"): [row]}))
    code, out, err = run(
        capsys,
        "workflow",
        "list",
        "--user",
        "alice",
        "--pool",
        "local",
        "--offset",
        "5",
        "--order",
        "asc",
        "--submitted-after",
        "2026-01-31",
        "--submitted-before",
        "2026-02-01T01:00:00+01:00",
    )
    assert (code, err) == (0, "")
    assert client.calls[0][2]["params"] == {
        "status": [],
        "label": [],
        "user": ["alice"],
        "pool": ["local"],
        "all_users": False,
        "offset": 5,
        "submitted_after_s": 1769817600.0,
        "submitted_before_s": 1769904000.0,
    }
    assert "01-31 12:00:05" in out and "hello-osmo-12" in out
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize(
    "argv", [("--order", "sideways"), ("--offset", "-1"), ("--submitted-after", "last tuesday")]
)
def test_list_refuses_bad_filters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    use(monkeypatch, FakeClient({("GET", "/api/workflow"): []}))
    code, out, err = run(capsys, "workflow", "list", *argv)
    assert (code, out) == (2, "")
    assert argv[0] in err


# ---------------------------------------------------------------------------- query, events, task list


def test_query_shows_labels_and_the_failure_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    task = {
        "name": "t",
        "lead": True,
        "status": "FAILED",
        "retry_id": 0,
        "exit_code": 7,
        "node": "n0",
        "start_time": "2026-01-31T12:00:00+00:00",
        "end_time": "2026-01-31T12:00:09+00:00",
        "failure_reason": "exit code 7",
    }
    use(
        monkeypatch,
        FakeClient(
            {
                ("GET", "/api/workflow/w-1"): {
                    "id": "w-1",
                    "name": "w",
                    "status": "FAILED",
                    "submitted_by": "alice",
                    "submit_time": "2026-01-31T11:59:59+00:00",
                    "labels": {"team": "vision", "run": "3"},
                    "groups": [{"name": "t", "tasks": [task]}],
                }
            }
        ),
    )
    code, out, _ = run(capsys, "workflow", "query", "w-1")
    assert code == 0
    assert "Labels: run=3, team=vision" in out and "t retry 0 failed: exit code 7" in out
    assert "12:00:09" in out and max(map(len, out.splitlines()[1:])) <= 80


def test_events_table_and_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {
            "time": "2026-01-31T12:00:01+00:00",
            "task": "t",
            "retry_id": 0,
            "event": "RUNNING",
            "exit_code": None,
            "message": None,
        },
        {
            "time": "2026-01-31T12:00:02+00:00",
            "task": "t",
            "retry_id": 0,
            "event": "RESCHEDULED",
            "exit_code": 1,
            "message": "exit code 1: retried",
        },
    ]
    use(monkeypatch, FakeClient({("GET", "/api/workflow/w-1/events"): rows}))
    code, out, _ = run(capsys, "workflow", "events", "w-1")
    assert code == 0 and "RESCHEDULED" in out and "01-31 12:00:02" in out
    code, out, _ = run(capsys, "workflow", "events", "w-1", "--format-type", "json")
    assert code == 0 and __import__("json").loads(out) == rows


def test_task_list_of_one_workflow_and_of_mine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainyard.cli import task as task_cli

    row = {
        "workflow": "w-1",
        "group": "g",
        "name": "t",
        "status": "RUNNING",
        "lead": True,
        "retry_id": 1,
        "exit_code": None,
        "node": "local-0",
        "start_time": "2026-01-31T12:00:00+00:00",
        "end_time": None,
        "failure_reason": None,
    }
    client = FakeClient({("GET", "/api/task"): [row]})
    monkeypatch.setattr(task_cli, "Client", lambda: client)
    code, out, _ = run(capsys, "task", "list", "w-1")
    assert code == 0 and "local-0" in out and "RUNNING" in out
    assert run(capsys, "task", "list", "-c", "5")[0] == 0
    sent = [c[2]["params"] for c in client.calls]
    assert [(p["count"], p.get("workflow"), p["status"]) for p in sent] == [
        (20, "w-1", []),
        (5, None, []),
    ]  # trainyard: every status; osmo: the active ones
    run(capsys, "task", "list", "-s", "RUNNING", "COMPLETED", "-u", "alice", "-n", "n0")
    assert {k: client.calls[-1][2]["params"][k] for k in ("status", "user", "node")} == {
        "status": ["RUNNING", "COMPLETED"],
        "user": ["alice"],
        "node": ["n0"],
    }


# ---------------------------------------------------------------------------- --wait


class _Answer:
    def __init__(self, data: dict[str, Any], key: str) -> None:
        self._data, self.headers = data, {"x-trainyard-progress": key}

    def json(self) -> dict[str, Any]:
        return self._data


class WaitClient(FakeClient):
    """Answers the status queries of ``--wait`` from a script (the last one repeats)."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        super().__init__(
            {("POST", "/api/workflow/w-1/restart"): {"id": "w-1", "status": "PENDING"}}
        )
        self.script = script
        self.asked = 0

    def request(self, method: str, path: str, **kwargs: Any) -> _Answer:
        data = self.script[min(self.asked, len(self.script) - 1)]
        self.asked += 1
        if isinstance(data, BaseException):
            raise data
        return _Answer(data, f"key-{self.asked}")


def _state(status: str, task: dict[str, Any], retries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "w-1",
        "name": "w",
        "status": status,
        "groups": [
            {"name": "t", "tasks": [{**task, "name": "t", "lead": True, "retries": retries}]}
        ],
    }


def _attempt(
    retry_id: int, status: str, exit_code: int | None = None, reason: str | None = None
) -> dict[str, Any]:
    return {
        "retry_id": retry_id,
        "status": status,
        "exit_code": exit_code,
        "node": "n0",
        "failure_reason": reason,
    }


def test_wait_shows_a_rescheduled_attempt_and_the_failed_tasks_log_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _attempt(0, "RUNNING")
    # the retry started before the next answer: RESCHEDULED is only in `retries`
    rescheduled = _attempt(0, "RESCHEDULED", 1)
    failed = _attempt(1, "FAILED", 3, "exit code 3")
    use(
        monkeypatch,
        WaitClient(
            [
                _state("RUNNING", first, [first]),
                _state("RUNNING", _attempt(1, "RUNNING"), [rescheduled, _attempt(1, "RUNNING")]),
                _state("FAILED", failed, [rescheduled, failed]),
            ]
        ),
    )
    code, out, _ = run(capsys, "workflow", "restart", "w-1", "--wait")
    assert code == 1
    assert "t RESCHEDULED on n0 (exit 1)" in out and "t retry 1 FAILED on n0 (exit 3)" in out
    assert "workflow FAILED" in out
    assert "Task t retry 1 FAILED (exit code 3): exit code 3" in out
    assert "trainyard workflow logs w-1 --task t --retry-id 1" in out


def test_ctrl_c_during_wait_says_the_workflow_goes_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use(
        monkeypatch,
        WaitClient([_state("RUNNING", _attempt(0, "RUNNING"), []), KeyboardInterrupt()]),
    )
    code, out, err = run(capsys, "workflow", "restart", "w-1", "--wait")
    assert code == 130
    assert "workflow w-1 goes on" in err and "trainyard workflow logs w-1" in err


# ---------------------------------------------------------------------------- 80 columns, sizes


def test_resource_list_marks_virtual_capacity_and_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainyard.cli import resource

    def node(pool: str, name: str, platform: str | None, virtual: bool) -> dict[str, Any]:
        cap = {"cpu": 64, "gpu": 8, "memory_bytes": 512 * 2**30, "storage_bytes": 2 * 2**40}
        used = {"cpu": 1.5, "gpu": 2, "memory_bytes": 3 * 2**29, "storage_bytes": 0}
        return {
            "pool": pool,
            "node": name,
            "platform": platform,
            "capacity": cap,
            "used": used,
            "free": {},
            "virtual": virtual,
        }

    rows = [
        node("local", "local-0", None, True),
        node("osmo", "agx-orin-jp6-0", "agx-orin-jp6", True),
        node("slurm-local", "trainyard-node1", None, False),
    ]
    monkeypatch.setattr(resource, "Client", lambda: FakeClient({("GET", "/api/resource"): rows}))
    code, out, _ = run(capsys, "resource", "list")
    assert code == 0
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, out
    assert "1.5GiB/512GiB" in out and "0B/2TiB" in out
    assert "pool local" in out and "pool slurm-local" in out
    local = next(line for line in lines if "local-0" in line)
    real = next(line for line in lines if "trainyard-node1" in line)
    assert "virtual" in local and "real" in real and "virtual" not in real
    assert any(line.startswith("virtual: capacity the pool declares") for line in lines)


@pytest.mark.parametrize(
    ("size", "shown"),
    [(0, "0B"), (12, "12B"), (1536, "1.5KiB"), (2**30, "1GiB"), (3 * 2**40, "3TiB")],
)
def test_one_size_format(size: int, shown: str) -> None:
    from trainyard.cli.output import human_bytes

    assert human_bytes(size) == shown


def test_logs_inside_a_task_of_that_workflow_do_not_follow_by_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task reading its own workflow's logs would otherwise wait for itself forever."""
    client = use(monkeypatch, FakeClient())
    client.token = "tyt1.w-1.abcdef"
    assert run(capsys, "workflow", "logs", "w-1")[0] == 0
    assert run(capsys, "workflow", "logs", "w-10")[0] == 0  # another workflow: follows
    assert run(capsys, "workflow", "logs", "w-1", "--follow")[0] == 0
    assert [c[2] for c in client.calls] == [{}, {"follow": True}, {"follow": True}]


def test_wait_says_why_a_group_waits_once_per_reason_and_shows_the_failed_tasks_tail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pending = _attempt(0, "SCHEDULING")
    why = "needs 4 GPUs on pool local: 0 of 32 free; held by gpu-hog-1"
    waiting = {
        **_state("PENDING", pending, [pending]),
        "waiting": [{"group": "t", "status": "SCHEDULING", "reason": why}],
    }
    failed = {
        **_attempt(0, "FAILED", 3, "the command exited with code 3"),
        "log_tail": ["loading", "oops: data missing"],
    }
    use(
        monkeypatch,
        WaitClient(
            [
                waiting,
                waiting,
                {
                    **_state("FAILED", failed, [failed]),
                    "waiting": [],
                    "failure": {
                        "task": "t",
                        "retry_id": 0,
                        "status": "FAILED",
                        "exit_code": 3,
                        "reason": "the command exited with code 3",
                        "log_tail": ["loading", "oops: data missing"],
                    },
                },
            ]
        ),
    )
    code, out, _ = run(capsys, "workflow", "restart", "w-1", "--wait")
    assert code == 1
    assert out.count(f"group t SCHEDULING: {why}") == 1
    assert "Task t retry 0 FAILED (exit code 3): the command exited with code 3" in out
    assert "last 2 line(s) of its log:\n    | loading\n    | oops: data missing" in out
