"""Issue 24, "a task token can POST /api/workflow/prune": a task token reaches only the
routes of ``scopes.TASK_TOKEN_ROUTES``, on its own workflow. The attack as seen (prune with a
task token deletes the submitter's ended workflows), then a walk of EVERY route the app
declares: each one off the list answers 403 to a task token, even about its own workflow;
each one on the list answers 403 about another workflow of the same submitter; and on the
dashboard a task token lists its own workflow only."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from conftest import QUIET, Live
from starlette.routing import Mount

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine
from trainyard.pools import default_local_pool
from trainyard.server.app import create_app
from trainyard.server.auth import TokenRegistry
from trainyard.server.scopes import PUBLIC_ROUTES, TASK_TOKEN_ROUTES
from trainyard.server.service import Service
from trainyard.store import Store

DONE = """
workflow:
  name: done
  tasks:
  - name: t
    command: ["true"]
"""

ARGS = {"name": "x", "task": "t", "action": "cancel", "user": "someone"}
OWN = {"workflow_id", "workflow_a", "workflow_b"}  # filled with the token's own workflow


def every_route(tmp_path: Path) -> set[tuple[str, str]]:
    """(method, path template) of every route the server's app declares (built here the
    way ``python -m trainyard.server`` builds it, over an empty store)."""
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": default_local_pool()},
        backend_factory=lambda p, h: FakeBackend(lambda launch: Outcome(0)),
    )
    app = create_app(Service(engine), TokenRegistry(tmp_path), run_engine=False)
    found = set()
    for route in app.routes:
        if isinstance(route, Mount):
            found.add(("GET", route.path))
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add((method, route.path))
    return found


def fill(template: str, workflow_id: str) -> str:
    """The template's path with ``workflow_id`` and harmless values for the others."""
    return re.sub(r"\{(\w+)\}", lambda m: workflow_id if m[1] in OWN else ARGS[m[1]], template)


@pytest.fixture(scope="module")
def running(live: Live) -> str:
    wid = live.submit(QUIET)
    live.wait_running(wid)
    return wid


def test_a_task_token_cannot_prune_its_submitters_ended_workflows(live: Live, running: str) -> None:
    ended = live.submit(DONE)
    assert live.wait_ended(ended) == "COMPLETED"
    answer = live.api(
        "POST", "/api/workflow/prune", live.task_token(running), json={"older_than_s": 0}
    )
    assert answer.status_code == 403, answer.text
    assert live.api("GET", f"/api/workflow/{ended}").status_code == 200  # still there


def test_every_route_off_the_list_refuses_a_task_token(
    live: Live, running: str, tmp_path: Path
) -> None:
    routes = every_route(tmp_path)
    assert TASK_TOKEN_ROUTES <= routes and PUBLIC_ROUTES <= routes  # no stale entry
    token = live.task_token(running)
    refused = sorted(routes - TASK_TOKEN_ROUTES - PUBLIC_ROUTES)
    assert ("POST", "/api/workflow/prune") in refused and len(refused) >= 15
    for method, template in refused:
        answer = live.api(method, fill(template, running), token, json={})
        assert answer.status_code == 403, (method, template, answer.text)


def test_routes_on_the_list_answer_for_the_own_workflow_only(live: Live, running: str) -> None:
    other = live.submit(QUIET)  # the same submitter's other workflow
    token = live.task_token(running)
    for method, template in sorted(TASK_TOKEN_ROUTES):
        if "{workflow_id}" not in template:
            continue
        theirs = live.api(method, fill(template, other), token)
        assert theirs.status_code == 403, (method, template, theirs.text)
        with httpx.stream(
            method,
            live.url + fill(template, running),
            timeout=30,
            headers={"Authorization": f"Bearer {token}"},
        ) as own:
            assert own.status_code == 200, (method, template)


def test_the_dashboard_lists_only_the_task_tokens_own_workflow(live: Live, running: str) -> None:
    other = live.submit(QUIET)
    page = httpx.get(
        live.url + "/",
        timeout=30,
        headers={"Authorization": f"Bearer {live.task_token(running)}", "Accept": "text/html"},
    )
    assert page.status_code == 200, page.text
    assert f"/workflows/{running}" in page.text and f"/workflows/{other}" not in page.text
    mine = httpx.get(live.url + "/", timeout=30, headers={"Authorization": f"Bearer {live.token}"})
    assert f"/workflows/{other}" in mine.text  # the submitter's own token sees both
