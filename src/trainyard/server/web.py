"""The web dashboard: server-rendered pages (Jinja2) over the service, at ``/``.

Auth is the API's: ``Authorization: Bearer TOKEN``, or a session cookie made by ``POST /login``
(HttpOnly, SameSite=Strict, a random id; the token behind it stays in memory and is checked on
every request). Without a valid session a page redirects to ``/login``. Every POST with a
session carries its CSRF token (hidden field, compared in constant time). Pages: ``/``,
``/workflows/ID``, ``/workflows/ID/logs`` (SSE from ``.../logs/stream``), ``/compare?id=A&id=B``,
``/pools``, ``/datasets``; JSON: ``GET /api/workflow/ID/metrics``, ``GET
/api/workflow/A/diff/B`` (``compare.diff_runs``). docs/dashboard.md.
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.concurrency import run_in_threadpool

from trainyard.errors import AuthError, ForbiddenError, TrainyardError
from trainyard.pools import real_gpu_count
from trainyard.server import dashboard
from trainyard.server.answers import DiffAnswer, LoginLinkAnswer, MetricsAnswer
from trainyard.server.auth import User, refuse_task_token
from trainyard.server.scopes import check_task_scope
from trainyard.server.service import Service
from trainyard.server.streams import (
    LogFeeds,
    LogReaders,
    SlotResponse,
    StreamSlots,
    follow_chunks,
    sse_events,
)
from trainyard.server.workflow_logs import LogCursor
from trainyard.status import WorkflowStatus

__all__ = ["add_dashboard", "SESSION_COOKIE", "WebSessions", "PAGE_SIZES"]

SESSION_COOKIE = "trainyard_session"
SESSION_TTL_S = 12 * 3600
LOGIN_CODE_TTL_S = 120.0
"""How long a one-time login link (``trainyard dashboard``) may wait to be opened."""
PAGE_SIZES = (25, 50, 100, 200)
_STATIC = Path(__file__).parent / "static"


@dataclass
class _Session:
    token: str
    csrf: str
    expires_s: float


class WebSessions:
    """Browser sessions: random id -> (token, CSRF token, expiry). In memory only."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._sessions: dict[str, _Session] = {}
        self._codes: dict[str, tuple[str, float]] = {}  # one-time login code -> (token, expiry)

    def create(self, token: str) -> str:
        """A new session id for ``token`` (already authenticated by the caller)."""
        now = time.time()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires_s > now}
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = _Session(token, secrets.token_urlsafe(24), now + self.ttl_s)
        return sid

    def get(self, sid: str | None) -> _Session | None:
        """The live session of ``sid``, or None."""
        session = self._sessions.get(sid or "")
        if session is None or session.expires_s <= time.time():
            return None
        return session

    def drop(self, sid: str | None) -> None:
        """End a session (logout); unknown ids are ignored."""
        self._sessions.pop(sid or "", None)

    def create_code(self, token: str, ttl_s: float = LOGIN_CODE_TTL_S) -> str:
        """A one-time login code for ``token`` (already authenticated by the caller), good
        for ``ttl_s`` seconds and one use (``trainyard dashboard``'s link)."""
        now = time.time()
        self._codes = {k: c for k, c in self._codes.items() if c[1] > now}
        code = secrets.token_urlsafe(32)
        self._codes[code] = (token, now + ttl_s)
        return code

    def take_code(self, code: str | None) -> str | None:
        """The token of a live login code, which is used up; None for an unknown, used or
        expired code."""
        entry = self._codes.pop(code or "", None)
        if entry is None or entry[1] <= time.time():
            return None
        return entry[0]


class _LoginNeeded(Exception):
    """A page was asked for without a valid session: redirect to the login page."""


@dataclass(frozen=True)
class Viewer:
    """Who looks at a page, and the CSRF token their forms carry ('' with a bearer token)."""

    user: User
    csrf: str


def _viewer(request: Request) -> Viewer:
    """Who asks, from a bearer token or the session cookie; a task token only on the routes
    ``scopes.TASK_TOKEN_ROUTES`` lists (ForbiddenError otherwise)."""
    viewer = _session_viewer(request)
    check_task_scope(viewer.user, request)
    return viewer


def _session_viewer(request: Request) -> Viewer:
    tokens = request.app.state.tokens
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return Viewer(tokens.authenticate(header[7:].strip()), "")
    session = request.app.state.web_sessions.get(request.cookies.get(SESSION_COOKIE))
    if session is None and request.url.path.startswith("/api/"):
        raise AuthError("no token given: send `Authorization: Bearer TOKEN`")
    if session is None:
        raise _LoginNeeded()
    try:
        return Viewer(tokens.authenticate(session.token), session.csrf)
    except AuthError:
        request.app.state.web_sessions.drop(request.cookies.get(SESSION_COOKIE))
        raise _LoginNeeded() from None


Look = Annotated[Viewer, Depends(_viewer)]


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (first value of each field), at most 64 KiB.

    Raises:
        ForbiddenError: the browser says the form came from another site (``Origin`` not
            this server), e.g. a page elsewhere logging a visitor into its own account; or
            from an opaque origin (``Origin: null``: a sandboxed frame, a ``data:`` or
            ``file:`` page), which no page of this dashboard is.
    """
    origin = request.headers.get("origin")
    if origin and (origin == "null" or urlsplit(origin).netloc != request.headers.get("host")):
        raise ForbiddenError(f"a form from {origin} may not post to this dashboard")
    body = (await request.body())[:65536].decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _sign(request: Request, text: str) -> str:
    """A MAC of ``text`` under this server's message key: the workflow page shows a
    ``msg`` only with its ``sig`` (the redirect after cancel or restart makes both), so a
    link cannot make the page show any text as the server's message."""
    key = request.app.state.message_key
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _check_csrf(viewer: Viewer, form: dict[str, str]) -> None:
    """A session POST must carry its CSRF token. Raises AuthError (401)."""
    if viewer.csrf and not hmac.compare_digest(viewer.csrf.encode(), form.get("csrf", "").encode()):
        raise AuthError("the form's CSRF token is missing or stale: reload the page")


def _safe_next(target: str | None) -> str:
    """Only a local path (no scheme, no ``//host``) may follow the login."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _templates() -> Environment:
    env = Environment(
        loader=PackageLoader("trainyard.server", "templates"),
        autoescape=select_autoescape(["html", "svg"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["duration"] = _duration
    env.filters["size"] = _size
    env.filters["utc"] = _iso_when
    env.globals["statuses"] = [s.value for s in WorkflowStatus]
    return env


def _when(time_s: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time_s)) if time_s else "-"


def _iso_when(iso_time: str | None) -> str:
    """An ISO 8601 time (the API's) as the dashboard's one format, ``YYYY-MM-DD HH:MM:SS``
    UTC; ``-`` for none."""
    if not iso_time:
        return "-"
    from datetime import datetime

    return _when(datetime.fromisoformat(iso_time).timestamp())


def _timing(state: Any, now_s: float) -> dict[str, float | None]:
    """How long the workflow queued (submit to its first task's start) and ran (from then
    to its end, or to ``now_s`` while it runs), in seconds; None for what did not happen."""
    starts = [t.start_time_s for t in state.tasks.values() if t.start_time_s is not None]
    starts += [
        a.start_time_s
        for t in state.tasks.values()
        for a in t.history
        if a.start_time_s is not None
    ]
    submit, end = state.submit_time_s, state.end_time_s
    first = min(starts) if starts else None
    queued = (first if first is not None else (end or now_s)) - submit if submit else None
    ran = (end or now_s) - first if first is not None else None
    return {"queued_s": queued, "ran_s": ran}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _size(count: float | None) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)


def add_dashboard(app: FastAPI, service: Service) -> None:
    """Mount the dashboard's pages, its SSE log stream and its static files on ``app``."""
    app.state.web_sessions = WebSessions()
    app.state.message_key = secrets.token_bytes(32)
    env = _templates()
    app.mount("/static", StaticFiles(directory=_STATIC), name="static")

    @app.exception_handler(_LoginNeeded)
    async def _to_login(request: Request, _exc: _LoginNeeded) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)

    def page(name: str, viewer: Viewer | None, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(name).render(viewer=viewer, **context)
        return HTMLResponse(html, status_code=status, headers=_SECURITY_HEADERS)

    api_error = app.exception_handlers.get(TrainyardError)

    @app.exception_handler(TrainyardError)
    async def _page_error(request: Request, exc: TrainyardError) -> Response:
        """A browser asking for a page gets the error as a page (same status code); the
        API and scripts keep the API's JSON error."""
        answer = api_error(request, exc) if api_error else Response(str(exc), 400)
        if inspect.isawaitable(answer):
            answer = await answer
        if request.url.path.startswith("/api/") or "text/html" not in request.headers.get(
            "accept", ""
        ):
            return answer
        return page("error.html", None, status=answer.status_code, error=str(exc))

    _auth_routes(app, page)
    _workflow_routes(app, service, page)
    _log_routes(app, service, page)
    _other_routes(app, service, page)


_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' "
    "'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _logged_in(request: Request, token: str, target: str) -> Response:
    """A new session for ``token`` (authenticated by the caller): its cookie, and a
    redirect to ``target``."""
    sid = request.app.state.web_sessions.create(token)
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        sid,
        max_age=SESSION_TTL_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


def _auth_routes(app: FastAPI, page: Any) -> None:
    @app.get("/login", response_class=HTMLResponse)
    def login_page(next: str = "/") -> HTMLResponse:  # noqa: A002 - the query's name
        return page("login.html", None, next=_safe_next(next), error="")

    @app.post("/login", response_class=HTMLResponse)
    async def login(request: Request) -> Response:
        form = await _form(request)
        target = _safe_next(form.get("next"))
        token = form.get("token", "").strip()
        try:
            request.app.state.tokens.authenticate(token)
        except AuthError as exc:
            return page("login.html", None, status=401, next=target, error=str(exc))
        return _logged_in(request, token, target)

    @app.get("/login/once")
    def login_once(request: Request, code: str = "", next: str = "/") -> Response:  # noqa: A002
        """A one-time link (``POST /api/login-link``): a session for its token, then the
        page ``next``; a used or expired link shows the login page."""
        target = _safe_next(next)
        token = request.app.state.web_sessions.take_code(code)
        if token is None:
            return page(
                "login.html",
                None,
                status=401,
                next=target,
                error="this login link was used or has expired; run `trainyard "
                "dashboard` for a new one, or paste a token",
            )
        return _logged_in(request, token, target)

    @app.post("/api/login-link", response_model=None)
    def login_link(request: Request, viewer: Look, next: str = "/") -> LoginLinkAnswer:  # noqa: A002
        """A one-time link that logs a browser in as the caller: ``{"path", "expires_in_s"}``
        (``path`` is relative to the server's address). Asked with a bearer token."""
        header = request.headers.get("authorization", "")
        if not header.lower().startswith("bearer "):
            raise AuthError("ask for a login link with `Authorization: Bearer TOKEN`")
        refuse_task_token(viewer.user, "open the dashboard")
        code = request.app.state.web_sessions.create_code(header[7:].strip())
        query = urlencode({"code": code, "next": _safe_next(next)})
        return {"path": f"/login/once?{query}", "expires_in_s": str(int(LOGIN_CODE_TTL_S))}

    @app.post("/logout")
    async def logout(request: Request, viewer: Look) -> Response:
        _check_csrf(viewer, await _form(request))
        request.app.state.web_sessions.drop(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response


def _list_filters(
    status: list[str] | None, label: list[str] | None
) -> tuple[list[str], dict[str, str]]:
    valid = {s.value for s in WorkflowStatus}
    statuses = [s for s in status or [] if s in valid]
    labels = dict(item.split("=", 1) for item in label or [] if "=" in item)
    return statuses, labels


def _workflow_routes(app: FastAPI, service: Service, page: Any) -> None:
    store = service.engine.store
    ended_timings: OrderedDict[str, dict[str, float | None]] = OrderedDict()

    @app.get("/", response_class=HTMLResponse)
    def workflows(
        viewer: Look,
        status: Annotated[list[str] | None, Query()] = None,
        user: str = "",
        pool: str = "",
        name: str = "",
        label: Annotated[list[str] | None, Query()] = None,
        page_no: Annotated[int, Query(alias="page", ge=1)] = 1,
        per_page: Annotated[int, Query(ge=1, le=max(PAGE_SIZES))] = 50,
    ) -> HTMLResponse:
        statuses, labels = _list_filters(status, label)
        owner = user if viewer.user.admin else viewer.user.name
        if viewer.user.workflow is not None:  # a task token sees its own workflow only
            rows, total = _own_row(service, viewer.user), 1
        else:
            rows, total = store.page_workflows(
                statuses=statuses,
                name=name or None,
                labels=labels,
                submitted_by=owner or None,
                pool=pool or None,
                offset=(page_no - 1) * per_page,
                limit=per_page,
            )
        now_s = time.time()
        rows = [{**row, **_row_timing(service, row["id"], now_s, ended_timings)} for row in rows]
        pages = max(1, math.ceil(total / per_page))
        query = {
            "status": statuses,
            "user": user,
            "pool": pool,
            "name": name,
            "label": label or [],
            "per_page": per_page,
        }
        return page(
            "workflows.html",
            viewer,
            rows=rows,
            total=total,
            page_no=page_no,
            pages=pages,
            filters=query,
            pools=sorted(service.engine.pools),
            link=lambda n: "/?" + urlencode({**query, "page": n}, doseq=True),
        )

    @app.get("/workflows/{workflow_id}", response_class=HTMLResponse)
    def workflow(
        workflow_id: str, request: Request, viewer: Look, msg: str = "", sig: str = ""
    ) -> HTMLResponse:
        msg = msg if msg and hmac.compare_digest(sig, _sign(request, msg)) else ""
        data = service.reads.query(workflow_id, viewer.user, verbose=True)
        state = service.engine.state(workflow_id)
        run_dir = _run_dir(service, workflow_id)
        bars = dashboard.timeline(state, run_dir, time.time())
        boxes = dashboard.dag_layout(state)
        return page(
            "workflow.html",
            viewer,
            wf=data,
            boxes=boxes,
            dag=_dag_geometry(boxes),
            bars=bars,
            gantt=_gantt(bars),
            msg=msg,
            spec=service.submissions.stored_spec(workflow_id, viewer.user),
            usage=dashboard.usage_summary(dashboard.usage(state, run_dir)),
            ended=state.status.is_terminal(),
            timing=_timing(state, time.time()),
        )

    @app.post("/workflows/{workflow_id}/{action}")
    async def act(workflow_id: str, action: str, request: Request, viewer: Look) -> Response:
        _check_csrf(viewer, await _form(request))
        calls: dict[str, tuple[Callable[[str, User], object], str]] = {
            "cancel": (service.control.cancel, "cancel requested"),
            "restart": (service.control.restart, "restarted"),
        }
        if action not in calls:
            return Response("unknown action", status_code=404)
        call, msg = calls[action]
        try:  # in a worker thread: the engine's lock must not stall the event loop
            await run_in_threadpool(call, workflow_id, viewer.user)
        except TrainyardError as exc:
            msg = f"{action} refused: {exc}"
        return RedirectResponse(
            f"/workflows/{workflow_id}?" + urlencode({"msg": msg, "sig": _sign(request, msg)}),
            status_code=303,
        )

    @app.get("/api/workflow/{workflow_id}/metrics", response_model=None)
    def metrics(workflow_id: str, viewer: Look) -> MetricsAnswer:
        return _metrics_json(service, workflow_id, viewer.user)

    @app.get("/api/workflow/{workflow_a}/diff/{workflow_b}", response_model=None)
    def diff(workflow_a: str, workflow_b: str, viewer: Look) -> DiffAnswer:
        return service.reads.diff(workflow_a, workflow_b, viewer.user)

    @app.get("/compare", response_class=HTMLResponse)
    def compare(
        viewer: Look,
        id: Annotated[list[str] | None, Query()] = None,  # noqa: A002
    ) -> HTMLResponse:
        ids = [i for i in id or [] if i][:8]
        runs = []
        for wid in ids:
            service.reads.query(wid, viewer.user)  # read permission
            runs += dashboard.curves(service.engine.state(wid), _run_dir(service, wid), wid)
        settings = service.reads.settings(ids, viewer.user) if len(ids) >= 2 else []
        diff = service.reads.diff(ids[0], ids[1], viewer.user) if len(ids) == 2 else None
        headers = [service.engine.store.get_workflow(wid) for wid in ids]
        return page(
            "compare.html",
            viewer,
            ids=ids,
            runs=runs,
            diff=diff,
            settings=settings,
            places=[f"{r.pool} / {_backend(service, r.pool)}" for r in headers],
        )


ENDED_TIMINGS = 10_000
"""Queue and run times of ended workflows the list keeps (they no longer change)."""


def _row_timing(
    service: Service,
    workflow_id: str,
    now_s: float,
    ended: OrderedDict[str, dict[str, float | None]],
) -> dict[str, float | None]:
    """A list row's ``queued_s`` and ``ran_s`` (see ``_timing``); an ended workflow's are
    kept in ``ended`` (at most ``ENDED_TIMINGS``), so a list refresh reads the stored state
    of the running ones only."""
    if workflow_id in ended:
        return ended[workflow_id]
    try:
        state = service.engine.state(workflow_id)
    except TrainyardError:
        return {"queued_s": None, "ran_s": None}
    timing = _timing(state, now_s)
    if state.status.is_terminal():
        ended[workflow_id] = timing
        while len(ended) > ENDED_TIMINGS:
            ended.popitem(last=False)
    return timing


def _backend(service: Service, pool: str) -> str:
    found = service.engine.pools.get(pool)
    return found.backend if found is not None else "unknown"


def _own_row(service: Service, user: User) -> list[dict[str, Any]]:
    """The list page's one row for a task token: its own workflow."""
    record = service.engine.store.get_workflow(str(user.workflow))
    return [
        {
            "id": record.id,
            "name": record.name,
            "status": record.status,
            "pool": record.pool,
            "submitted_by": record.submitted_by,
            "labels": record.labels,
            "submit_time_s": record.submit_time_s,
            "end_time_s": record.end_time_s,
        }
    ]


def _run_dir(service: Service, workflow_id: str) -> dashboard.RunDir:
    return lambda task, retry: service.engine.run_dir(workflow_id, task, retry)


def _metrics_json(service: Service, workflow_id: str, user: User) -> MetricsAnswer:
    """``{"id", "status", "curves": [...], "usage": [...], "summary": [...]}`` (see
    ``dashboard.curves``, ``dashboard.usage``, ``dashboard.usage_summary``)."""
    data = service.reads.query(workflow_id, user)  # read permission
    state = service.engine.state(workflow_id)
    run_dir = _run_dir(service, workflow_id)
    samples = dashboard.usage(state, run_dir)
    return {
        "id": workflow_id,
        "status": data["status"],
        "curves": dashboard.curves(state, run_dir),
        "usage": samples,
        "summary": dashboard.usage_summary(samples),
    }


def _gantt(bars: list[dashboard.AttemptBar]) -> dict[str, Any]:
    """Scale of the Gantt chart: start, span (seconds) and the pixel width of the bar area."""
    starts = [p.start_s for b in bars for p in b.phases]
    ends = [p.end_s for b in bars for p in b.phases]
    start = min(starts, default=0.0)
    span = max(max(ends, default=0.0) - start, 1.0)
    return {"start": start, "span": span, "width": 760, "left": 200}


def _dag_geometry(boxes: list[dashboard.DagBox]) -> dict[str, Any]:
    """Pixel places of the DAG's boxes: ``{"boxes": {name: (x, y, height)}, "width",
    "height", "box_width"}``; every box of a column is as tall as the tallest group."""
    box_w, gap_x, gap_y = 220, 60, 20
    tallest = max((len(b.tasks) for b in boxes), default=1)
    box_h = 34 + 18 * tallest
    places = {
        b.name: (10 + b.column * (box_w + gap_x), 10 + b.row * (box_h + gap_y), box_h)
        for b in boxes
    }
    width = max((x for x, _, _ in places.values()), default=0) + box_w + 20
    height = max((y for _, y, _ in places.values()), default=0) + box_h + 20
    return {"boxes": places, "width": width, "height": height, "box_width": box_w}


def _log_routes(app: FastAPI, service: Service, page: Any) -> None:
    @app.get("/workflows/{workflow_id}/logs", response_class=HTMLResponse)
    def logs_page(
        workflow_id: str, viewer: Look, task: str = "", retry_id: int | None = None
    ) -> HTMLResponse:
        data = service.reads.query(workflow_id, viewer.user)
        tasks = [t for g in data["groups"] for t in g["tasks"]]
        return page(
            "logs.html",
            viewer,
            wf=data,
            tasks=tasks,
            task=task,
            retry_id=retry_id,
            stream="/workflows/{}/logs/stream?{}".format(
                workflow_id,
                urlencode(
                    {
                        k: v
                        for k, v in {"task": task, "retry_id": retry_id}.items()
                        if v not in ("", None)
                    }
                    | {"verbose": "true"}  # the page hides the detail lines unless asked
                ),
            ),
        )

    @app.get("/workflows/{workflow_id}/logs/stream")
    def logs_stream(
        workflow_id: str,
        viewer: Look,
        task: str | None = None,
        retry_id: int | None = None,
        lines: Annotated[int, Query(ge=1, le=100_000)] = 5000,
        verbose: bool = False,
    ) -> Response:
        cursor = service.logs.open_follow(
            workflow_id,
            viewer.user,
            task=task or None,
            retry_id=retry_id,
            last_lines=lines,
            verbose=verbose,
        )  # 404/403 now
        slots: StreamSlots = app.state.stream_slots
        slots.take(viewer.user.name)  # 429 beyond the user's cap, before the stream starts
        return SlotResponse(
            _sse(cursor, app.state.log_readers, app.state.log_feeds),
            slots,
            viewer.user.name,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )


async def _sse(
    cursor: LogCursor, readers: LogReaders, feeds: LogFeeds | None = None
) -> AsyncIterator[str]:
    """Server-Sent Events: one ``data:`` JSON object per log line (``LogLine.to_json``),
    a comment every ``streams.SSE_KEEPALIVE_S`` while quiet, then ``event: end`` once the
    workflow ended and its logs are drained. Waits hold no thread
    (``streams.follow_chunks``; with ``feeds``, the followers of one log share one reader);
    a closed page cancels it at its next wait."""
    yield "retry: 2000\n\n"
    chunks = follow_chunks(cursor, sse_events, readers, keepalive=": keepalive\n\n", feeds=feeds)
    try:
        async for chunk in chunks:
            yield chunk
    finally:
        await chunks.aclose()  # leaves the shared reader now, not when collected
    yield "event: end\ndata: {}\n\n"


def _other_routes(app: FastAPI, service: Service, page: Any) -> None:
    @app.get("/pools", response_class=HTMLResponse)
    def pools(viewer: Look) -> HTMLResponse:
        pools = service.pools.summaries()
        return page(
            "pools.html",
            viewer,
            pools=pools,
            nodes=service.pools.resources(),
            backends={p["name"]: p["backend"] for p in pools},
            machine_gpus=real_gpu_count(),
        )

    @app.get("/datasets", response_class=HTMLResponse)
    def datasets(viewer: Look) -> HTMLResponse:
        from trainyard.data.datasets import Actor, DatasetStore  # the data layer, only here

        rows, error = [], ""
        try:  # what `dataset list` shows this user: their own, shared with them, unowned
            store = DatasetStore(actor=Actor(viewer.user.name, viewer.user.admin))
            for name in store.names()[:500]:
                info = store.info(name)
                rows.append(
                    {
                        "name": name,
                        "versions": [
                            {
                                "version": v.version,
                                "tags": info.tags_of(v.version),
                                "files": len(v.files),
                                "size_bytes": v.size_bytes,
                                "created_s": v.created_s,
                            }
                            for v in reversed(info.versions)
                        ],
                    }
                )
        except TrainyardError as exc:
            error = str(exc)
        return page("datasets.html", viewer, datasets=rows, error=error)
