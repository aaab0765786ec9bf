"""Workflows out: one workflow as the CLI prints it (with a long poll for ``--wait``), the
lists of workflows, tasks and tags a user may see, each attempt's events, and two runs side
by side. Reads only; who may read is ``ownership.readable``."""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Any

from trainyard.engine import machine as m
from trainyard.engine.reconciler import Engine
from trainyard.errors import BadArgumentError, ForbiddenError, SpecError
from trainyard.server import compare
from trainyard.server.answers import (
    DiffAnswer,
    EventAnswer,
    TaskRowAnswer,
    WorkflowAnswer,
    WorkflowSummary,
)
from trainyard.server.auth import User
from trainyard.server.logs import read_detail
from trainyard.server.osmo_filters import ListFilters, TaskFilters, priority_of, tags_of
from trainyard.server.ownership import readable
from trainyard.server.shapes import (
    add_outputs,
    event_message,
    event_row,
    row_summary_json,
    summary_json,
    task_json,
    workflow_json,
)
from trainyard.spec.models import WorkflowSpec
from trainyard.status import WorkflowStatus
from trainyard.store import WorkflowRecord

MAX_QUERY_WAIT_S = 10.0
"""The longest a ``GET /api/workflow/{id}?wait_s=`` long poll is held, seconds."""


MAX_HELD_QUERIES = 8
"""Long polls held at once. Each holds a worker thread of the server (40 in all, shared by
every synchronous route), so many waiting clients never starve the other requests."""


_HELD_QUERIES = threading.BoundedSemaphore(MAX_HELD_QUERIES)


def progress_key(state: m.WorkflowState) -> str:
    """What ``--wait`` prints progress from, as a short key: the workflow's status, each
    task's status, retry id, node and exit code, and a digest of its groups' waiting
    reasons. Two states with equal keys print alike."""
    tasks = ",".join(
        f"{t.name}:{t.status.value}:{t.retry_id}:{t.node}:{t.exit_code}"
        for t in state.tasks.values()
    )
    reasons = "\n".join(g.waiting_reason or "" for g in state.groups.values())
    waits = hashlib.blake2s(reasons.encode(), digest_size=6).hexdigest() if reasons.strip() else ""
    return f"{state.status.value}|{tasks}|{waits}"


class WorkflowReads:
    """What a user may see of one engine's workflows."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def query(
        self, workflow_id: str, user: User, *, verbose: bool = False, isolation: bool = False
    ) -> WorkflowAnswer:
        """The workflow in the CLI's JSON shape (``groups[].tasks[]``; ``retries`` when
        verbose; with ``isolation``, each task's ``isolation``: the detail lines of how its
        current attempt is isolated, read from the head of its task log, ``read_detail``)."""
        record = readable(self.engine.store, workflow_id, user)
        state = self.engine.state(workflow_id)
        data = workflow_json(record, state, verbose)
        if isolation:
            for group in data["groups"]:
                for task in group["tasks"]:
                    path = self.engine.run_dir(workflow_id, task["name"], task["retry_id"])
                    task["isolation"] = read_detail(path / "task.log", task["name"])
        data["priority"], data["tags"] = priority_of(record.source), tags_of(record.source)
        add_outputs(data, record, lambda task, retry: self.engine.run_dir(workflow_id, task, retry))
        return data

    def query_when_changed(
        self,
        workflow_id: str,
        user: User,
        *,
        known: str | None,
        wait_s: float,
        verbose: bool = False,
        isolation: bool = False,
        interval_s: float = 0.25,
    ) -> tuple[WorkflowAnswer, str]:
        """``query``, answered as soon as the workflow's progress differs from ``known`` (a
        key this method returned before), or it ended, or ``wait_s`` passed (a long poll:
        ``--wait`` sees the end as soon as the engine stores it, ``Engine.wait_for_change``,
        instead of at its own poll interval).

        At most ``MAX_HELD_QUERIES`` are held at once (each holds one of the server's worker
        threads); a query beyond them is answered at once, as without ``known``.

        Args:
            known: the progress key of the client's last answer; None answers at once.
            wait_s: the longest wait, seconds (capped at ``MAX_QUERY_WAIT_S``).
            interval_s: the longest between two looks at the engine's state when no change
                is stored (a safety net: every change is stored, and wakes the look).

        Returns:
            (the ``query`` answer, its progress key).

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        readable(self.engine.store, workflow_id, user)
        if known is not None and wait_s > 0 and _HELD_QUERIES.acquire(blocking=False):
            try:
                self._hold_while_unchanged(
                    workflow_id, known, min(wait_s, MAX_QUERY_WAIT_S), interval_s
                )
            finally:
                _HELD_QUERIES.release()
        data = self.query(workflow_id, user, verbose=verbose, isolation=isolation)
        return data, progress_key(self.engine.state(workflow_id))

    def _hold_while_unchanged(
        self, workflow_id: str, known: str, wait_s: float, interval_s: float
    ) -> None:
        deadline = time.monotonic() + wait_s
        while (remaining := deadline - time.monotonic()) > 0:
            seen = self.engine.changes()  # before the look: a change after it wakes the wait
            state = self.engine.state(workflow_id)
            if progress_key(state) != known or state.status.is_terminal():
                return
            self.engine.wait_for_change(seen, min(interval_s, remaining))

    def list_workflows(
        self,
        user: User,
        *,
        statuses: list[str] | None = None,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        count: int | None = None,
        submitted_by: str | list[str] | None = None,
        pool: str | list[str] | None = None,
        offset: int = 0,
        oldest_first: bool = False,
        submitted_after_s: float | None = None,
        submitted_before_s: float | None = None,
        all_users: bool | None = None,
        filters: ListFilters | None = None,
    ) -> list[WorkflowSummary]:
        """Workflows visible to ``user``, newest first (``oldest_first``: oldest first),
        skipping the first ``offset``; read through ``Store.page_workflows`` (the
        dashboard's query). A non-admin sees only their own workflows. Whose: those of
        ``submitted_by`` (one user or several), else with ``all_users`` False the caller's
        own (OSMO's default), with True everyone's; None (a client before OSMO's flags):
        an admin's everyone's. ``filters``: OSMO's tags, priority, app, no-label.

        Raises:
            BadArgumentError: an unknown status or priority (the valid ones are named), ``count``
                below 1 or ``offset`` below 0.
            ForbiddenError: a non-admin asked for another user's workflows.
        """
        _check_list_filters(statuses, count)
        if offset < 0:
            raise BadArgumentError(f"offset must be 0 or more, not {offset}")
        if user.workflow is not None:  # a task token sees its own workflow only
            return [summary_json(readable(self.engine.store, user.workflow, user))]
        users = [submitted_by] if isinstance(submitted_by, str) else list(submitted_by or [])
        others = [u for u in users if u != user.name]
        if not user.admin and others:
            raise ForbiddenError(
                f"only an admin may list the workflows of {others[0]}; you are {user.name}"
            )
        if not user.admin or (not users and all_users is False):
            users = users or [user.name]
        rows, _total = self.engine.store.page_workflows(
            statuses=statuses,
            name=name,
            labels=labels,
            pool=pool,
            offset=offset,
            limit=count or 2**31 - 1,
            oldest_first=oldest_first,
            submitted_by=users or None,
            submitted_after_s=submitted_after_s,
            submitted_before_s=submitted_before_s,
            keep=filters.keep() if filters else None,
        )
        return [row_summary_json(row) for row in rows]

    def tags(self, user: User) -> list[str]:
        """Every tag on a workflow ``user`` may read (OSMO's ``workflow tag`` without
        ``-w``: the tags there are to assign), sorted."""
        found: set[str] = set()

        def collect(row: dict[str, Any]) -> bool:
            found.update(tags_of(row.get("source") or {}))
            return False

        self.engine.store.page_workflows(
            limit=1, keep=collect, submitted_by=None if user.admin else user.name
        )
        return sorted(found)

    def tasks(
        self,
        user: User,
        *,
        workflow_id: str | None = None,
        count: int = 20,
        filters: TaskFilters | None = None,
    ) -> list[TaskRowAnswer]:
        """The tasks of one workflow, or of ``user``'s latest ``count`` workflows (an
        admin's: everyone's), each ``{"workflow", "group", "name", "status", "retry_id",
        "node", "exit_code", "start_time", "end_time", "failure_reason", "pool", "user",
        "priority"}``. With ``filters`` (OSMO's ``task list``), ``count`` is the number of
        tasks: those of every workflow the filters' users may see, newest workflow first,
        kept by the filters, then paged by ``filters.offset``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``; BadArgumentError: ``count`` below 1.
        """
        if workflow_id is not None:
            workflows = [readable(self.engine.store, workflow_id, user)]
        elif filters is None:
            workflows = [
                self.engine.store.get_workflow(w["id"])
                for w in self.list_workflows(user, count=count)
            ]
        else:
            workflows = [
                self.engine.store.get_workflow(w["id"])
                for w in self.list_workflows(
                    user,
                    submitted_by=filters.users or None,
                    all_users=filters.all_users,
                    pool=filters.pools or None,
                )
            ]
        rows = [row for record in workflows for row in self._task_rows(record)]
        if filters is None:
            return rows
        kept = [row for row in rows if filters.keep(row)]
        return kept[filters.offset : filters.offset + count]

    def _task_rows(self, record: WorkflowRecord) -> list[TaskRowAnswer]:
        state = self.engine.state(record.id)
        priority = priority_of(record.source)
        return [
            {
                "workflow": record.id,
                "group": group.name,
                **task_json(state.tasks[t], False),
                "pool": record.pool,
                "user": record.submitted_by,
                "priority": priority,
            }
            for group in state.groups.values()
            for t in group.tasks
        ]

    def events(self, workflow_id: str, user: User) -> list[EventAnswer]:
        """The transitions of every task attempt, oldest first: the runner's events from
        each attempt's ``events.jsonl`` (INITIALIZING, RUNNING, EXITED with its exit code
        and message) and the attempt's end status as the engine recorded it (COMPLETED,
        RESCHEDULED, FAILED*), each with its time.

        Returns:
            ``[{"time": ISO 8601 UTC, "task", "retry_id", "event", "exit_code",
            "message"}]``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
        """
        from trainyard.runner.report import EVENTS, read_events

        readable(self.engine.store, workflow_id, user)
        state = self.engine.state(workflow_id)
        rows: list[tuple[float, EventAnswer]] = []
        for name, ts in state.tasks.items():
            attempts: list[m.TaskState | m.TaskAttempt] = [*ts.history, ts]
            for a in attempts:
                run_dir = self.engine.run_dir(workflow_id, name, a.retry_id)
                for e in read_events(run_dir / EVENTS)[0]:
                    rows.append(
                        (
                            e.time_s,
                            event_row(
                                e.time_s,
                                name,
                                a.retry_id,
                                e.kind,
                                e.exit_code,
                                event_message(e, a),
                            ),
                        )
                    )
                if a.status.is_terminal() and a.end_time_s is not None:
                    rows.append(
                        (
                            a.end_time_s,
                            event_row(
                                a.end_time_s,
                                name,
                                a.retry_id,
                                a.status.value,
                                a.exit_code,
                                a.failure_reason,
                            ),
                        )
                    )
        return [row for _t, row in sorted(rows, key=lambda r: r[0])]

    def diff(self, workflow_a: str, workflow_b: str, user: User) -> DiffAnswer:
        """Two workflows side by side (``trainyard workflow diff A B``): the settings that
        differ, final metrics, and whether their saved models are identical tensor by tensor
        (``compare.diff_runs`` gives the shape). Reads model files: may take a while.

        Raises:
            NotFoundError, ForbiddenError: as ``query``, for either workflow.
        """
        facts_a, facts_b = self._facts(workflow_a, user), self._facts(workflow_b, user)
        return compare.diff_runs(facts_a, facts_b)

    def settings(self, workflow_ids: list[str], user: User) -> list[dict[str, Any]]:
        """The settings that differ among workflows (``/compare``): ``[{"field", "values"}]``,
        one value per workflow in the order given (``compare.settings_table``).

        Raises:
            NotFoundError, ForbiddenError: as ``query``, for any of them.
        """
        return compare.settings_table([self._facts(w, user) for w in workflow_ids])

    def _facts(self, workflow_id: str, user: User) -> compare.RunFacts:
        record = readable(self.engine.store, workflow_id, user)
        try:
            workflow: WorkflowSpec | None = self.engine.spec_of(record)
        except SpecError:
            workflow = None
        pool = self.engine.pools.get(record.pool)
        return compare.run_facts(
            record,
            workflow,
            self.engine.state(workflow_id),
            lambda task, retry: self.engine.run_dir(workflow_id, task, retry),
            pool.backend if pool is not None else "unknown",
        )


def _check_list_filters(statuses: list[str] | None, count: int | None) -> None:
    """Refuse an unknown workflow status or a count below 1 (BadArgumentError, HTTP 400)."""
    valid = [s.value for s in WorkflowStatus]
    unknown = [s for s in statuses or [] if s not in valid]
    if unknown:
        raise BadArgumentError(
            f"unknown workflow status {', '.join(map(repr, unknown))}; statuses: {', '.join(valid)}"
        )
    if count is not None and count < 1:
        raise BadArgumentError(f"count must be at least 1, not {count}")
