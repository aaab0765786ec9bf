"""Who may read or change a workflow: its submitter, an admin, or a task token of that
workflow (reads only where the caller also says so, ``auth.refuse_task_token``)."""

from __future__ import annotations

from trainyard.errors import AuthError, ForbiddenError, NotFoundError
from trainyard.server.auth import User
from trainyard.status import WorkflowStatus
from trainyard.store import Store, WorkflowRecord


def readable(store: Store, workflow_id: str, user: User) -> WorkflowRecord:
    """The record of ``workflow_id`` when ``user`` may read or change it: their own, any
    for an admin, only its own workflow for a task token.

    Raises:
        NotFoundError: no such workflow.
        ForbiddenError: another user's workflow (or, for a task token, another workflow).
    """
    if user.workflow is not None and workflow_id != user.workflow:
        raise ForbiddenError(
            f"a task token of workflow {user.workflow} may not read or "
            f"change workflow {workflow_id}"
        )
    record = store.get_workflow(workflow_id)
    if not user.admin and record.submitted_by != user.name:
        raise ForbiddenError(
            f"workflow {workflow_id} belongs to {record.submitted_by}; only they or an "
            "admin may read or change it"
        )
    return record


def task_token_owner(store: Store, workflow_id: str) -> str:
    """The submitter a task token of ``workflow_id`` acts as (``TokenRegistry``'s
    ``workflow_owner``).

    Raises:
        AuthError: the workflow is unknown or has ended (its tasks' tokens expire with it).
    """
    try:
        record = store.get_workflow(workflow_id)
    except NotFoundError:
        raise AuthError("unknown token") from None
    if WorkflowStatus(record.status).is_terminal():
        raise AuthError(
            f"task token of workflow {workflow_id}: the workflow ended "
            f"({record.status}); task tokens expire with their workflow"
        )
    return record.submitted_by
