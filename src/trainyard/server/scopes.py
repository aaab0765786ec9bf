"""What a task token may call: an explicit allow-list of the server's routes.

A task token (``trainyard.tasktokens``) acts as its workflow's submitter, but only to read
that one workflow: its record, spec, logs, events, metrics and tasks, the server's version
and who the token is (what OSMO's CLI inside a task asks: ``osmo version``, ``workflow
query|logs`` of its own workflow, ``whoami`` for datasets), the pools and nodes, and the
dashboard's pages of that workflow. Every other route (submit, cancel, delete, prune,
restart, apps, exec, pool reload, ...) answers 403 to a task token, and so does a route of
the list asked about another workflow. A route added later is refused until it is put on
the list: a test walks every route of the app (``tests/integration/server``).

``PUBLIC_ROUTES`` need no token at all (health, the login page, static files).
"""

from __future__ import annotations

from starlette.requests import Request

from trainyard.errors import ForbiddenError
from trainyard.server.auth import User

__all__ = ["TASK_TOKEN_ROUTES", "PUBLIC_ROUTES", "check_task_scope", "route_key"]

Route = tuple[str, str]
"""(HTTP method, path template as the app declares it)."""

TASK_TOKEN_ROUTES: frozenset[Route] = frozenset(
    {
        ("GET", "/api/version"),
        ("GET", "/api/whoami"),
        (
            "GET",
            "/api/workflow",
        ),  # lists the token's own workflow only (WorkflowReads.list_workflows)
        ("GET", "/api/workflow/{workflow_id}"),
        ("GET", "/api/workflow/{workflow_id}/spec"),
        ("GET", "/api/workflow/{workflow_id}/logs"),
        ("GET", "/api/workflow/{workflow_id}/events"),
        ("GET", "/api/workflow/{workflow_id}/metrics"),
        ("GET", "/api/task"),  # the token's own workflow's tasks only (WorkflowReads.tasks)
        ("GET", "/api/pool"),
        ("GET", "/api/resource"),
        ("GET", "/"),  # the dashboard's list: the token's own workflow only
        ("GET", "/workflows/{workflow_id}"),
        ("GET", "/workflows/{workflow_id}/logs"),
        ("GET", "/workflows/{workflow_id}/logs/stream"),
        ("POST", "/logout"),
    }
)
"""The routes a task token may call (``GET`` also allows ``HEAD``)."""

PUBLIC_ROUTES: frozenset[Route] = frozenset(
    {
        ("GET", "/api/health"),
        ("GET", "/login"),
        ("POST", "/login"),
        ("GET", "/login/once"),  # a one-time code is the credential there (web.login_once)
        ("GET", "/static"),  # the dashboard's CSS and scripts (a mount)
    }
)
"""Routes that need no token (a task token is not checked there)."""


def route_key(request: Request) -> Route:
    """The request's (method, path template); HEAD counts as GET. A request that matched
    no route keeps its path."""
    route = request.scope.get("route")
    template = getattr(route, "path", None) or request.url.path
    method = "GET" if request.method == "HEAD" else request.method
    return method, template


def check_task_scope(user: User, request: Request) -> None:
    """Refuse a task token's call outside ``TASK_TOKEN_ROUTES`` or about another workflow.

    Raises:
        ForbiddenError: ``user`` holds a task token and the route is not on the list, or
            its ``workflow_id`` is not the token's workflow (HTTP 403).
    """
    if user.workflow is None:
        return
    method, template = route_key(request)
    if (method, template) not in TASK_TOKEN_ROUTES:
        raise ForbiddenError(
            f"a task token (of workflow {user.workflow}) may not call "
            f"{method} {template}; it only reads its own workflow"
        )
    other = request.path_params.get("workflow_id")
    if other is not None and other != user.workflow:
        raise ForbiddenError(
            f"a task token of workflow {user.workflow} may not read or change workflow {other}"
        )
