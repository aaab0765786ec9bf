"""The table from what a pod shows to facts (``states.view_of``), one case per row, with pods
as the API returns them."""

from __future__ import annotations

import json
from typing import Any

from trainyard.backends.base import FactKind
from trainyard.backends.kubernetes.podmain import MESSAGE_LIMIT_BYTES, termination_message
from trainyard.backends.kubernetes.states import view_of


def _pod(
    phase: str = "Pending",
    state: dict[str, Any] | None = None,
    *,
    reason: str | None = None,
    init_waiting: str | None = None,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [{"name": "task", "state": state}]
    if init_waiting:
        status["initContainerStatuses"] = [
            {
                "name": "trainyard-runner",
                "state": {"waiting": {"reason": init_waiting, "message": "pull access denied"}},
            }
        ]
    if reason:
        status["reason"], status["message"] = reason, f"{reason} by the test"
    if conditions:
        status["conditions"] = conditions
    return {"metadata": {"name": "p"}, "status": status}


def test_pending_pod_has_no_fact() -> None:
    assert view_of(_pod()) == view_of(_pod("Pending", {"waiting": {"reason": "PodInitializing"}}))
    assert not view_of(_pod()).started and view_of(_pod()).ending is None


def test_running_container_is_started() -> None:
    view = view_of(_pod("Running", {"running": {"startedAt": "2026-11-26T00:00:00Z"}}))
    assert view.started and view.ending is None


def test_termination_message_gives_the_runners_code_and_message() -> None:
    message = json.dumps(
        {"kind": "EXITED", "time_s": 1.0, "exit_code": 2010, "message": "input 0 failed"}
    )
    view = view_of(_pod("Failed", {"terminated": {"exitCode": 255, "message": message}}))
    assert (view.ending, view.exit_code, view.message) == (FactKind.EXITED, 2010, "input 0 failed")


def test_oom_killed_without_message_is_its_exit_code_and_reason() -> None:
    view = view_of(_pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))
    assert (view.ending, view.exit_code) == (FactKind.EXITED, 137)
    assert "OOMKilled" in view.message


def test_image_pull_failure_of_task_or_init_container_is_a_start_error() -> None:
    for pod in (
        _pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "x"}}),
        _pod("Pending", init_waiting="ErrImagePull"),
    ):
        view = view_of(pod)
        assert view.ending is FactKind.START_ERROR and "image pull failed" in view.message


def test_evicted_pod_exits_with_osmos_evicted_code() -> None:
    view = view_of(_pod("Failed", reason="Evicted"))
    assert (view.ending, view.exit_code) == (FactKind.EXITED, 3004)


def test_evicted_while_running_is_the_runners_stopped_exit_named_evicted() -> None:
    report = json.dumps({"kind": "EXITED", "exit_code": 143, "message": "stopped by SIGTERM"})
    view = view_of(
        _pod("Failed", {"terminated": {"exitCode": 143, "message": report}}, reason="Evicted")
    )
    assert (view.ending, view.exit_code) == (FactKind.EXITED, 143)
    assert view.message == "stopped by SIGTERM; pod Evicted: Evicted by the test"


def test_deadline_exceeded_and_unknown_failures_are_lost() -> None:
    assert view_of(_pod("Failed", reason="DeadlineExceeded")).ending is FactKind.LOST
    assert view_of(_pod("Failed", reason="SomethingNew")).ending is FactKind.LOST


def test_gone_pod_is_lost() -> None:
    assert view_of(None).ending is FactKind.LOST


def test_unschedulable_is_a_waiting_reason_not_a_fact() -> None:
    view = view_of(
        _pod(
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes: 3 Insufficient nvidia.com/gpu",
                }
            ]
        )
    )
    assert view.ending is None and "Insufficient nvidia.com/gpu" in view.waiting


def test_termination_message_fits_the_kubelets_limit(tmp_path: Any) -> None:
    event = {"kind": "EXITED", "time_s": 2.0, "exit_code": 3, "message": "é" * 10000}
    (tmp_path / "events.jsonl").write_text(json.dumps(event) + "\n")
    text = termination_message(tmp_path, 3)
    assert len(text.encode()) <= MESSAGE_LIMIT_BYTES
    assert json.loads(text)["exit_code"] == 3 and json.loads(text)["message"].startswith("...")
    assert json.loads(termination_message(tmp_path / "none", 9))["exit_code"] == 9
