"""The one table from what a Pod shows to backend facts (STYLE.md #4), and the function that
reads a Pod (its API JSON) with it. Pure; a pod never becomes a status (the engine decides).

Task container running: INITIALIZING and RUNNING; terminated: EXITED with the runner's code
from ``podmain``'s termination message (else the container's code and reason); waiting with
an image reason of ``IMAGE_FAILURES``: START_ERROR; Evicted before the container ran: EXITED
3004 (FAILED_EVICTED); ``DeadlineExceeded``, gone, or Failed without a terminated container:
LOST. Sources: Kubernetes docs, "Pod Lifecycle", "Node-pressure Eviction", "API-initiated
Eviction", "Pod Garbage Collection"; kubelet's image pull reasons. Each row explained:
docs/kubernetes.md, "Pod states as facts (states.py)".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainyard.backends.base import FactKind
from trainyard.status import ExitCode

__all__ = ["PodView", "view_of", "IMAGE_FAILURES", "POD_REASONS", "unschedulable_reason"]

IMAGE_FAILURES = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
    }
)
"""Waiting reasons of a container whose image cannot be had (kubelet's images package)."""

POD_REASONS: dict[str, tuple[FactKind, int | None]] = {
    "Evicted": (FactKind.EXITED, int(ExitCode.EVICTED)),
    "Preempting": (FactKind.EXITED, int(ExitCode.PREEMPTED)),
    "DeadlineExceeded": (FactKind.LOST, None),
    "NodeLost": (FactKind.LOST, None),
    "UnexpectedAdmissionError": (FactKind.START_ERROR, None),
    "OutOfcpu": (FactKind.START_ERROR, None),
    "OutOfmemory": (FactKind.START_ERROR, None),
    "NodeAffinity": (FactKind.START_ERROR, None),
}
"""``status.reason`` of a Failed pod without the task container's exit -> (fact, exit code)."""


@dataclass(frozen=True)
class PodView:
    """What one look at a pod says about its attempt.

    Attributes:
        started: the task container runs or ran (INITIALIZING and RUNNING are due).
        ending: the fact that ends the attempt (None: not over yet).
        exit_code: with ``ending`` EXITED, the code.
        message: why (the runner's message, the kubelet's reason and message).
        waiting: why the pod waits, for the user (Unschedulable, image pulls); "" if not.
    """

    started: bool = False
    ending: FactKind | None = None
    exit_code: int | None = None
    message: str = ""
    waiting: str = ""


def _task_status(pod: dict[str, Any], container: str) -> dict[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == container), {})


def _waiting_image_failure(pod: dict[str, Any]) -> str:
    """``reason: message`` of a container (init or task) that cannot get its image."""
    status = pod.get("status") or {}
    for entry in (status.get("initContainerStatuses") or []) + (
        status.get("containerStatuses") or []
    ):
        waiting = (entry.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_FAILURES:
            return f"{entry.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(
                ": "
            )
    return ""


def unschedulable_reason(pod: dict[str, Any]) -> str:
    """The scheduler's message of a pod it cannot place (``PodScheduled`` False,
    ``Unschedulable``), else ""."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".rstrip(": ")
    return ""


def _exited(terminated: dict[str, Any]) -> PodView:
    """The task container's end: the runner's EXITED event (termination message), else its
    exit code and the kubelet's reason."""
    try:
        event = json.loads(terminated.get("message") or "")
        if event.get("kind") == "EXITED" and isinstance(event.get("exit_code"), int):
            return PodView(True, FactKind.EXITED, event["exit_code"], str(event.get("message", "")))
    except (ValueError, AttributeError):
        pass
    code = int(terminated.get("exitCode", ExitCode.UNKNOWN))
    reason = terminated.get("reason") or ""
    text = f"container {reason or 'ended'} (exit code {code}) without the runner's exit report"
    tail = (terminated.get("message") or "").strip()
    return PodView(True, FactKind.EXITED, code, f"{text}: {tail[-400:]}" if tail else text)


def _with_pod_reason(view: PodView, status: dict[str, Any]) -> PodView:
    """``view`` with the pod's own reason (``Evicted``: the kubelet stopped the runner, which
    reported 143) added to its message."""
    reason = status.get("reason")
    if not reason:
        return view
    note = f"pod {reason}: {status.get('message', '')}".rstrip(": ")
    return PodView(
        view.started,
        view.ending,
        view.exit_code,
        f"{view.message}; {note}" if view.message else note,
    )


def view_of(pod: dict[str, Any] | None, container: str = "task") -> PodView:
    """Read one pod (``None``: it is gone) as a ``PodView``.

    Args:
        pod: the pod's API object (JSON), as a watch or a list returns it.
        container: the task container's name.
    """
    if pod is None:
        return PodView(
            ending=FactKind.LOST,
            message="the pod is gone (deleted, or its node was lost and the pod collected)",
        )
    status = pod.get("status") or {}
    state = _task_status(pod, container).get("state") or {}
    if state.get("terminated"):
        return _with_pod_reason(_exited(state["terminated"]), status)
    image = _waiting_image_failure(pod)
    if image:
        return PodView(ending=FactKind.START_ERROR, message=f"image pull failed: {image}")
    reason = status.get("reason") or ""
    if status.get("phase") == "Failed":
        kind, code = POD_REASONS.get(reason, (FactKind.LOST, None))
        text = f"pod {reason or 'Failed'}: {status.get('message', '')}".rstrip(": ")
        return PodView(bool(state), kind, code, text)
    if reason in ("Evicted", "DeadlineExceeded"):
        kind, code = POD_REASONS[reason]
        return PodView(bool(state), kind, code, f"pod {reason}: {status.get('message', '')}")
    return PodView(started=bool(state.get("running")), waiting=unschedulable_reason(pod))
