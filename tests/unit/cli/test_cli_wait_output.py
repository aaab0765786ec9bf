"""What ``--wait`` prints (issue 28): one time format (UTC, seconds, as the log lines) with the
elapsed time; the workflow's final status after the last log lines; every task's exit (or
why it has none); no markdown backticks. A fake client answers a scripted series (unit)."""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from trainyard.cli import workflow_ops

LEAD_ENDED = "Lead task finished"


def _task(
    name: str, status: str, lead: bool, exit_code: int | None, reason: str | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "status": status,
        "lead": lead,
        "retry_id": 0,
        "node": "local-0",
        "exit_code": exit_code,
        "failure_reason": reason,
        "output_dir": "/out",
        "outputs": ["dataset demo-out"] if lead else [],
    }


def _answer(status: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": "wf-1", "status": status, "groups": [{"name": "g", "tasks": tasks}]}


ANSWERS = [
    _answer(
        "RUNNING", [_task("lead", "RUNNING", True, None), _task("worker", "RUNNING", False, None)]
    ),
    _answer(
        "COMPLETED",
        [
            _task("lead", "COMPLETED", True, 0),
            _task("worker", "COMPLETED", False, None, LEAD_ENDED),
        ],
    ),
]


class _Response:
    def __init__(self, data: dict[str, Any], key: str) -> None:
        self._data, self.headers = data, {"x-trainyard-progress": key}

    def json(self) -> dict[str, Any]:
        return self._data


class _Client:
    """Answers ``ANSWERS`` in turn; its log stream holds its last line (the upload) until
    the final answer was given, as the server's follow does when the lead's upload ends
    after the workflow's status was stored."""

    def __init__(self) -> None:
        self.asked = 0
        self.ended = threading.Event()

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> _Response:
        data = ANSWERS[min(self.asked, len(ANSWERS) - 1)]
        self.asked += 1
        if data["status"] == "COMPLETED":
            self.ended.set()
        return _Response(data, f"k{self.asked}")

    def stream_lines(self, path: str, **params: Any) -> Iterator[str]:
        yield "2026/11/27 01:00:00 [lead] training"
        assert self.ended.wait(10)
        yield "2026/11/27 01:00:09 [lead][trainyard] output: 3 file(s) uploaded to dataset demo-out"


@pytest.fixture()
def printed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out = io.StringIO()
    view = Console(file=out, width=300, highlight=False, soft_wrap=True, color_system=None)
    workflow_ops.wait_for(_Client(), "wf-1", logs=True, view=view)  # type: ignore[arg-type]
    return out.getvalue().splitlines()


STAMP = re.compile(r"^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d ")


def test_status_lines_have_the_log_lines_clock_and_the_elapsed_time(printed: list[str]) -> None:
    status = [line for line in printed if " RUNNING" in line or " COMPLETED on" in line]
    assert status, printed
    for line in status:
        assert STAMP.match(line) and re.search(r" \+\d+\.\ds ", line), line


def test_the_final_status_comes_after_the_last_log_lines(printed: list[str]) -> None:
    upload = next(
        i
        for i, line in enumerate(printed)
        if "uploaded to dataset demo-out" in line and "[lead][trainyard]" in line
    )
    final = next(i for i, line in enumerate(printed) if "workflow COMPLETED" in line)
    assert upload < final, printed


def test_every_task_says_its_exit_or_why_it_has_none(printed: list[str]) -> None:
    lead = next(line for line in printed if "lead COMPLETED" in line)
    worker = next(line for line in printed if "worker COMPLETED" in line)
    assert "(exit 0)" in lead, lead
    assert worker.endswith(" (no exit code): Lead task finished"), worker  # OSMO's words


def test_no_markdown_backticks(printed: list[str]) -> None:
    assert not [line for line in printed if "`" in line], printed
