"""OSMO's workflow attributes that live in a workflow's stored ``source``: its priority
(``workflow submit --priority``), its tags (``workflow tag``), the app it came from
(``app submit``), and the ``workflow list`` filters on them and on label keys.

OSMO's rules (its CLI reference, ``osmo workflow list|tag``): a workflow's priority is HIGH,
NORMAL (the default) or LOW; tags are free words, removed before added; ``--tags`` keeps
workflows holding any of the tags, ``--priority`` any of the priorities, ``--app NAME`` (or
``NAME:VERSION``) those submitted from that app, ``--no-label KEY`` those without that key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from trainyard.errors import BadArgumentError

__all__ = [
    "TaskFilters",
    "PRIORITIES",
    "DEFAULT_PRIORITY",
    "ListFilters",
    "priority_of",
    "tags_of",
    "app_of",
    "retag",
    "check_priority",
]

PRIORITIES: tuple[str, ...] = ("HIGH", "NORMAL", "LOW")
"""OSMO's workflow priorities, highest first."""

DEFAULT_PRIORITY = "NORMAL"


def check_priority(priority: str) -> str:
    """``priority`` upper-cased; BadArgumentError (HTTP 400, exit 2) naming the choices otherwise."""
    wanted = priority.upper()
    if wanted not in PRIORITIES:
        raise BadArgumentError(
            f"unknown priority {priority!r}; priorities: {', '.join(PRIORITIES)}"
        )
    return wanted


def priority_of(source: dict[str, Any]) -> str:
    """The priority a workflow was submitted with (NORMAL for one submitted before
    priorities were kept)."""
    return str((source.get("request") or {}).get("priority") or DEFAULT_PRIORITY)


def tags_of(source: dict[str, Any]) -> list[str]:
    """A workflow's tags, sorted."""
    return sorted(source.get("tags") or [])


def app_of(source: dict[str, Any]) -> str | None:
    """``NAME:VERSION`` of the app a workflow was submitted from, else None."""
    app = (source.get("request") or {}).get("app")
    return str(app) if app else None


def retag(source: dict[str, Any], add: list[str], remove: list[str]) -> dict[str, Any]:
    """``source`` with ``remove`` taken from its tags, then ``add`` added (OSMO: remove is
    applied before add)."""
    tags = (set(source.get("tags") or []) - set(remove)) | set(add)
    return {**source, "tags": sorted(tags)}


def _app_matches(source: dict[str, Any], wanted: str) -> bool:
    app = app_of(source)
    if app is None:
        return False
    return app == wanted if ":" in wanted else app.split(":", 1)[0] == wanted


@dataclass(frozen=True)
class ListFilters:
    """``workflow list``'s filters on what a workflow's ``source`` and labels hold; empty
    ones keep every workflow."""

    tags: list[str] = field(default_factory=list)
    priorities: list[str] = field(default_factory=list)
    app: str | None = None
    no_labels: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.tags or self.priorities or self.app or self.no_labels)

    def keep(self) -> Callable[[dict[str, Any]], bool]:
        """A test of one ``Store.page_workflows`` row (with its ``source``)."""
        priorities = [check_priority(p) for p in self.priorities]

        def keep(row: dict[str, Any]) -> bool:
            source = row.get("source") or {}
            return (
                (not self.tags or bool(set(self.tags) & set(tags_of(source))))
                and (not priorities or priority_of(source) in priorities)
                and (self.app is None or _app_matches(source, self.app))
                and not set(self.no_labels) & set(row.get("labels") or {})
            )

        return keep


@dataclass(frozen=True)
class TaskFilters:
    """OSMO's ``task list`` filters: whose workflows (``users``, else with ``all_users``
    everyone's, else the caller's), which pools, and of each task its status, node,
    start time (Unix seconds: at or after ``started_after_s``, before
    ``started_before_s``) and its workflow's priority; ``offset`` skips that many kept."""

    users: list[str] = field(default_factory=list)
    all_users: bool = False
    pools: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    started_after_s: float | None = None
    started_before_s: float | None = None
    priorities: list[str] = field(default_factory=list)
    offset: int = 0

    def keep(self, row: Mapping[str, Any]) -> bool:
        """Whether a task row (``WorkflowReads.tasks``' shape) passes every filter."""
        from datetime import datetime

        started = row.get("start_time")
        started_s = datetime.fromisoformat(started).timestamp() if started else None
        after_ok = self.started_after_s is None or (
            started_s is not None and started_s >= self.started_after_s
        )
        before_ok = self.started_before_s is None or (
            started_s is not None and started_s < self.started_before_s
        )
        return (
            (not self.statuses or row["status"] in self.statuses)
            and (not self.nodes or row.get("node") in self.nodes)
            and (
                not self.priorities
                or row.get("priority") in [check_priority(p) for p in self.priorities]
            )
            and after_ok
            and before_ok
        )
