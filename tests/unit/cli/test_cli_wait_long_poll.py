"""``--wait`` (``workflow_ops.wait_for``) long-polls a server that can, and polls one that
cannot (issue 15): a fake client records each status query and answers a scripted series."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from trainyard.cli import workflow_ops


class _Answer:
    def __init__(self, status: str, key: str | None) -> None:
        self._status = status
        self.headers = {} if key is None else {"x-trainyard-progress": key}

    def json(self) -> dict[str, Any]:
        return {"id": "wf-1", "status": self._status, "groups": []}


class _Client:
    def __init__(self, statuses: list[str], long_polls: bool) -> None:
        self.statuses, self.long_polls = statuses, long_polls
        self.params: list[dict[str, Any]] = []

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> _Answer:
        assert (method, path) == ("GET", "/api/workflow/wf-1")
        self.params.append(dict(params or {}))
        status = self.statuses[min(len(self.params) - 1, len(self.statuses) - 1)]
        return _Answer(status, f"key-{len(self.params)}" if self.long_polls else None)


@pytest.fixture()
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(workflow_ops.time, "sleep", slept.append)
    return slept


def _view() -> Console:
    return Console(file=io.StringIO())


def test_long_poll_server_is_asked_with_the_last_key_and_never_slept_on(
    sleeps: list[float],
) -> None:
    client = _Client(["PENDING", "RUNNING", "COMPLETED"], long_polls=True)
    data = workflow_ops.wait_for(client, "wf-1", logs=False, view=_view())  # type: ignore[arg-type]
    assert data["status"] == "COMPLETED"
    assert client.params == [
        {"verbose": True},
        {"verbose": True, "known": "key-1", "wait_s": workflow_ops.LONG_POLL_S},
        {"verbose": True, "known": "key-2", "wait_s": workflow_ops.LONG_POLL_S},
    ]
    assert sleeps == []


def test_server_without_long_polls_is_polled_with_growing_intervals(sleeps: list[float]) -> None:
    client = _Client(["PENDING", "RUNNING", "RUNNING", "COMPLETED"], long_polls=False)
    data = workflow_ops.wait_for(
        client,
        "wf-1",
        logs=False,
        poll_s=0.25,
        max_poll_s=0.5,  # type: ignore[arg-type]
        view=_view(),
    )
    assert data["status"] == "COMPLETED"
    assert client.params == [{"verbose": True}] * 4
    assert sleeps == [0.25, 0.375, 0.5]


class _BusyServer(_Client):
    """Has long polls but holds none (all in use): answers the same key at once."""

    def request(self, method: str, path: str, params: dict[str, Any] | None = None) -> _Answer:
        self.params.append(dict(params or {}))
        status = self.statuses[min(len(self.params) - 1, len(self.statuses) - 1)]
        return _Answer(status, "same-key" if status != "COMPLETED" else "end-key")


def test_a_server_answering_unchanged_at_once_is_not_asked_in_a_busy_loop(
    sleeps: list[float],
) -> None:
    client = _BusyServer(["RUNNING", "RUNNING", "RUNNING", "COMPLETED"], long_polls=True)
    workflow_ops.wait_for(
        client,
        "wf-1",
        logs=False,
        poll_s=0.25,
        max_poll_s=0.5,  # type: ignore[arg-type]
        view=_view(),
    )
    assert sleeps == [0.25, 0.375]
