"""Workflows changed: cancel, restart, delete, prune, tag, and how to enter a running task.
Each change is the submitter's or an admin's, never a task token's."""

from __future__ import annotations

import time
from typing import cast

from trainyard.engine import machine as m
from trainyard.engine.reconciler import Engine
from trainyard.errors import NotFoundError, RefusedError
from trainyard.server.answers import (
    CancelAnswer,
    DeleteAnswer,
    KeptAnswer,
    PruneAnswer,
    TagAnswer,
    TaskEntryAnswer,
    WorkflowSummary,
)
from trainyard.server.auth import User, refuse_task_token
from trainyard.server.osmo_filters import retag, tags_of
from trainyard.server.ownership import readable
from trainyard.server.shapes import summary_json
from trainyard.status import Status, WorkflowStatus


class WorkflowControl:
    """Changes to one engine's workflows, on a user's behalf."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def cancel(
        self, workflow_id: str, user: User, *, message: str | None = None, force: bool = False
    ) -> CancelAnswer:
        """Cancel (idempotent); returns the workflow summary with ``had_ended``: true when
        the workflow had already ended before this call (nothing was cancelled), and
        ``cancel_message``: OSMO's ``--message``, kept with the workflow (the first one
        given). ``force`` (OSMO's ``--force``, "Force cancel task group pods"): no grace
        period, its tasks' processes SIGKILLed at once (``Engine.cancel``); also for a
        workflow already being cancelled."""
        record = readable(self.engine.store, workflow_id, user)
        refuse_task_token(user, "cancel a workflow")
        had_ended = WorkflowStatus(record.status).is_terminal()
        source = record.source
        if message and not had_ended and not source.get("cancel"):
            source = self.engine.store.update_workflow_source(
                workflow_id,
                lambda old: {
                    **old,
                    "cancel": {"message": message, "by": user.name, "force": force},
                },
            )
        self.engine.cancel(workflow_id, force=force)
        return {
            **summary_json(self.engine.store.get_workflow(workflow_id)),
            "had_ended": had_ended,
            "cancel_message": (source.get("cancel") or {}).get("message"),
        }

    def restart(self, workflow_id: str, user: User, *, pool: str | None = None) -> WorkflowSummary:
        """Run the failed groups of a failed workflow again, keeping completed ones.

        ``pool`` (OSMO's ``restart -p``) must be the workflow's own pool: its completed
        groups' outputs stay where they ran.

        Raises:
            NotFoundError, ForbiddenError: as ``query``.
            RefusedError: as ``Engine.restart``; ``pool`` names another pool.
        """
        record = readable(self.engine.store, workflow_id, user)
        refuse_task_token(user, "restart a workflow")
        if pool is not None and pool != record.pool:
            raise RefusedError(
                f"workflow {workflow_id} ran on pool {record.pool}; a restart "
                f"stays there (its completed groups' outputs are there): submit "
                f"it again on {pool} with `workflow submit {workflow_id} "
                f"--pool {pool}`"
            )
        self.engine.restart(workflow_id)
        return summary_json(self.engine.store.get_workflow(workflow_id))

    def delete(self, workflow_ids: list[str], user: User) -> DeleteAnswer:
        """Delete ended workflows (rows and run folders; never their uploads), all or none.
        The same rule as ``cancel``: each must be ``user``'s, unless an admin.

        Returns:
            ``{"deleted": [ids]}``.

        Raises:
            NotFoundError, ForbiddenError: as ``cancel``, for any id (nothing deleted).
            RefusedError: one has not ended (``Engine.delete``).
        """
        for workflow_id in workflow_ids:
            readable(self.engine.store, workflow_id, user)
        self.engine.delete(workflow_ids)
        return {"deleted": list(dict.fromkeys(workflow_ids))}

    def prune(
        self, older_than_s: float, user: User, *, dry_run: bool = False, limit: int | None = None
    ) -> PruneAnswer:
        """Delete the ended workflows of ``user`` (every user's, for an admin) that ended
        more than ``older_than_s`` seconds ago, oldest first, at most ``limit`` of them per
        call (each takes tens of ms: a caller asks again while ``more``); one that cannot be
        deleted now (an attempt still stopping) is left and named in ``kept``.

        Returns:
            ``{"deleted": [ids], "kept": [{"id", "reason"}], "more": bool}`` (with
            ``dry_run``, every id that would be deleted, nothing removed).
        """
        records = self.engine.store.list_workflows(
            ended_before_s=time.time() - older_than_s,
            submitted_by=None if user.admin else user.name,
        )
        ids = [r.id for r in reversed(records)]
        if dry_run:
            return {"deleted": ids, "kept": [], "more": False, "dry_run": True}
        more = limit is not None and len(ids) > limit
        ids = ids[:limit] if limit is not None else ids
        deleted: list[str] = []
        kept: list[KeptAnswer] = []
        for workflow_id in ids:
            try:
                self.engine.delete([workflow_id])
                deleted.append(workflow_id)
            except (RefusedError, NotFoundError) as exc:
                kept.append({"id": workflow_id, "reason": str(exc)})
        return {"deleted": deleted, "kept": kept, "more": more}

    def tag(
        self, workflow_ids: list[str], user: User, *, add: list[str], remove: list[str]
    ) -> list[TagAnswer]:
        """OSMO's ``workflow tag``: remove ``remove`` from, then add ``add`` to, each
        workflow's tags (the caller's own workflows; an admin's any). All are checked
        before any changes. Returns ``[{"id", "tags"}]``.

        Raises:
            NotFoundError, ForbiddenError: as ``query``; a task token may not tag.
        """
        refuse_task_token(user, "tag a workflow")
        ids = [readable(self.engine.store, workflow_id, user).id for workflow_id in workflow_ids]
        store = self.engine.store
        return [
            {
                "id": workflow_id,
                "tags": tags_of(
                    store.update_workflow_source(
                        workflow_id, lambda source: retag(source, add, remove)
                    )
                ),
            }
            for workflow_id in ids
        ]

    def task_entry(
        self, workflow_id: str, task: str, user: User, *, retry_id: int | None = None
    ) -> TaskEntryAnswer:
        """How to enter a running task (``workflow exec``, ``port-forward``, ``rsync``): the
        same rule as ``cancel`` (the workflow's submitter or an admin; never a task token).

        Returns:
            ``{"workflow_id", "task", "retry_id", "status"}`` plus the backend's ``entry``
            (``LocalBackend.entry``: ``backend``, ``machine``, ``pid``, ``created``,
            ``address``, ``run_dir``).

        Raises:
            NotFoundError: no such workflow, task or retry (exit 3).
            ForbiddenError: as ``cancel``.
            RefusedError: the attempt is not running (ended: exit 4), or cannot be entered.
        """
        record = readable(self.engine.store, workflow_id, user)
        refuse_task_token(user, "exec in a task")
        state = self.engine.state(workflow_id)
        current = state.tasks.get(task)
        if current is None:
            raise NotFoundError(
                f"workflow {workflow_id} has no task {task!r}; its tasks: "
                f"{', '.join(sorted(state.tasks))}"
            )
        retry = current.retry_id if retry_id is None else retry_id
        status = Status(_attempt_status(current, retry, workflow_id))
        if status is not Status.RUNNING:
            when = (
                "has ended"
                if status.is_terminal() or retry != current.retry_id
                else "is not running yet"
            )
            raise RefusedError(
                f"task {task} (retry {retry}) of workflow {workflow_id} {when} "
                f"({status.value}); only a RUNNING task can be entered"
            )
        from trainyard.backends.base import TaskKey

        entry = self.engine.task_entry(record.pool, TaskKey(workflow_id, task, retry))
        return cast(
            TaskEntryAnswer,
            {"workflow_id": workflow_id, "task": task, "retry_id": retry, "status": status.value}
            | entry,
        )


def _attempt_status(task: m.TaskState, retry_id: int, workflow_id: str) -> Status:
    """The status of attempt ``retry_id`` of ``task`` (NotFoundError if it never was)."""
    if retry_id == task.retry_id:
        return task.status
    for attempt in task.history:
        if attempt.retry_id == retry_id:
            return attempt.status
    raise NotFoundError(
        f"task {task.name} of workflow {workflow_id} has no retry {retry_id} "
        f"(latest: {task.retry_id})"
    )
