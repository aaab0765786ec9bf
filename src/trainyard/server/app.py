"""The REST API (FastAPI) over the service facade; the engine's loop runs inside it.

Every route but ``/api/health`` needs ``Authorization: Bearer TOKEN`` (401 otherwise); a
task token only the routes of ``scopes.TASK_TOKEN_ROUTES`` (403 otherwise). The OpenAPI
schema is at ``/api/openapi.json``, behind a token. Errors answer ``{"detail": [{"message",
"path", "line", "file"}], "kind": ...}`` with a status code per error class (SpecError 422,
NotFoundError 404, AuthError 401, ForbiddenError 403, other refusals 400, a body over
``bodylimit.MAX_BODY_BYTES`` 413: FastAPI's ``max_body_size``); ``kind`` names the class in
``trainyard.errors`` so the CLI raises the same error (same exit code). Spec warnings, the
log stream (``format=json``, ``lines``, ``follow``; 429 beyond
``streams.MAX_STREAMS_PER_USER``), the long poll (``X-Trainyard-Progress``, ``known``,
``wait_s`` ≤ 10) and delete/prune: docs/reference.md, "REST API".
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Header, Query, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.types import ASGIApp

import trainyard
from trainyard.engine import retention
from trainyard.errors import ForbiddenError, NotFoundError, SpecError, TrainyardError
from trainyard.server.access_routes import add_access_routes
from trainyard.server.answers import (
    AppAnswer,
    AppDeletedAnswer,
    AppRenamedAnswer,
    CancelAnswer,
    CredentialAnswer,
    DeleteAnswer,
    DeletedAnswer,
    DryRunAnswer,
    EventAnswer,
    HealthAnswer,
    PoolAnswer,
    PoolReloadAnswer,
    PruneAnswer,
    ResourceAnswer,
    SubmitAnswer,
    TagAnswer,
    TaskEntryAnswer,
    TaskRowAnswer,
    ValidateAnswer,
    VersionAnswer,
    WhoamiAnswer,
    WorkflowSummary,
)
from trainyard.server.auth import TokenRegistry, User, refuse_task_token
from trainyard.server.bodylimit import MAX_BODY_BYTES, DeclaredTooLarge, on_body_too_large
from trainyard.server.logs import LogLine
from trainyard.server.osmo_filters import ListFilters, TaskFilters
from trainyard.server.schema import SpecRequest, check_app_name
from trainyard.server.scopes import check_task_scope
from trainyard.server.service import Service
from trainyard.server.shapes import iso, spec_error_json
from trainyard.server.streams import (
    LogFeeds,
    LogReaders,
    SlotResponse,
    StreamSlots,
    follow_chunks,
    iterate_in_readers,
    json_lines,
    text_lines,
)
from trainyard.server.web import add_dashboard
from trainyard.store import AppRecord, Store

__all__ = ["create_app"]

_STATUS = {SpecError: 422, NotFoundError: 404}

PROGRESS_HEADER = "X-Trainyard-Progress"
"""Header of ``GET /api/workflow/{id}``: the progress key to send back as ``known``."""


class AppRequest(BaseModel):
    """An app version: a workflow template with its ``localpath`` files inlined."""

    spec_text: str
    files: dict[str, str] = {}
    set: list[str] = []
    """Values to check the template with (``--set``); not stored."""
    set_string: list[str] = []
    description: str | None = None
    """OSMO's ``app create -d``: kept with the version (None: the latest version's)."""


class RenameRequest(BaseModel):
    """OSMO's ``app rename``: the app's new name."""

    new_name: str = Field(min_length=1, max_length=200)


class TagRequest(BaseModel):
    """OSMO's ``workflow tag``: tags to remove from, then add to, each workflow."""

    workflows: list[str] = Field(min_length=1)
    add: list[str] = []
    remove: list[str] = []


class CredentialRequest(BaseModel):
    """``credential set``: OSMO's type and the payload (``store.credentials``)."""

    type: str = "GENERIC"
    payload: dict[str, str]

    def __repr__(self) -> str:  # never a value in a traceback or a log line
        return f"CredentialRequest(type={self.type!r}, keys={sorted(self.payload)!r})"

    __str__ = __repr__


class DeleteRequest(BaseModel):
    """``workflow delete``: ended workflows to delete, all or none."""

    ids: list[str] = Field(min_length=1)


class PruneRequest(BaseModel):
    """``workflow prune``: delete the caller's workflows (an admin: everyone's) that ended
    more than ``older_than_s`` seconds ago."""

    older_than_s: float = Field(ge=0)
    dry_run: bool = False
    limit: int = Field(default=100, ge=1, le=10_000)
    """At most this many per request (the answer's ``more`` says whether to ask again)."""


class _API(FastAPI):
    """FastAPI with ``bodylimit.DeclaredTooLarge`` outside its middleware (outside its body
    limit, which answers a declared over-size body in plain text)."""

    def build_middleware_stack(self) -> ASGIApp:
        return DeclaredTooLarge(super().build_middleware_stack())


def _error_response(exc: TrainyardError) -> JSONResponse:
    body: dict[str, Any] = {"kind": type(exc).__name__}
    if isinstance(exc, SpecError):
        body["detail"] = spec_error_json(exc)
        body["warnings"] = [w.to_json() for w in exc.warnings]
    else:
        body["detail"] = [{"message": str(exc), "path": "", "line": None, "file": None}]
    status = getattr(exc, "http_status", None) or next(
        (code for cls, code in _STATUS.items() if isinstance(exc, cls)), 400
    )
    return JSONResponse(body, status_code=status)


def current_user(request: Request, authorization: Annotated[str | None, Header()] = None) -> User:
    """The caller, from ``Authorization: Bearer TOKEN``.

    Raises:
        AuthError: no token or an unknown one (401).
        ForbiddenError: a task token on a route it may not call (403, ``scopes``).
    """
    token = None
    if authorization and authorization.lower().startswith("bearer "):
        token = authorization[7:].strip()
    user = request.app.state.tokens.authenticate(token)
    check_task_scope(user, request)
    return user


Caller = Annotated[User, Depends(current_user)]


def create_app(service: Service, tokens: TokenRegistry, *, run_engine: bool = True) -> FastAPI:
    """The API app. With ``run_engine``, the engine loop runs in a thread for the app's life."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = threading.Thread(
            target=service.engine.run_forever, args=(stop,), name="trainyard-engine", daemon=True
        )
        if run_engine:
            thread.start()
            retention.start_sweeper(service.engine, stop, retention.run_retention_s())
        yield
        stop.set()
        if run_engine:
            thread.join(timeout=10)
        service.engine.close()

    app = _API(
        title="trainyard",
        version=trainyard.__version__,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        max_body_size=MAX_BODY_BYTES,
        exception_handlers={413: on_body_too_large},
    )  # behind a token below
    app.state.tokens = tokens
    app.state.log_readers = LogReaders()
    app.state.stream_slots = StreamSlots()
    app.state.log_feeds = LogFeeds()

    @app.exception_handler(TrainyardError)
    async def _on_error(_request: Request, exc: TrainyardError) -> JSONResponse:
        return _error_response(exc)

    _routes(app, service)
    _app_routes(app, service)
    add_access_routes(app, tokens)  # OSMO's token and user commands
    add_dashboard(app, service)  # the web pages at /, trainyard.server.web
    return app


def _routes(app: FastAPI, service: Service) -> None:
    @app.get("/api/health", response_model=None)
    async def health() -> HealthAnswer:
        """Answered on the event loop itself: no worker thread, no lock, no store."""
        return {"status": "ok", "version": trainyard.__version__}

    @app.get("/api/openapi.json")
    def openapi(_u: Caller) -> dict[str, Any]:
        """The API's OpenAPI schema, for a user's token (no unauthenticated /docs)."""
        return app.openapi()

    @app.get("/api/version", response_model=None)
    def version(_u: Caller) -> VersionAnswer:
        return {"version": trainyard.__version__}

    @app.get("/api/whoami", response_model=None)
    def whoami(u: Caller) -> WhoamiAnswer:
        """Who the token is: ``{"user", "admin", "workflow"}`` (``workflow``: a task token's)."""
        return {"user": u.name, "admin": u.admin, "workflow": u.workflow}

    @app.post("/api/workflow/validate", response_model=None)
    def validate(req: SpecRequest, u: Caller) -> ValidateAnswer:
        loaded = service.submissions.validate(req, u)
        return {
            "valid": True,
            "name": loaded.workflow.name,
            "pool": loaded.pool.name,
            "warnings": loaded.warnings_json(),
        }

    @app.post("/api/workflow/spec", response_model=None)
    def render(
        req: SpecRequest,
        _u: Caller,
        fmt: Annotated[Literal["text", "json"], Query(alias="format")] = "text",
    ) -> PlainTextResponse | dict[str, Any]:
        loaded = service.submissions.load(req)
        if fmt == "json":
            return {"spec": loaded.rendered_text, "warnings": loaded.warnings_json()}
        return PlainTextResponse(loaded.rendered_text)

    @app.post("/api/workflow", response_model=None)
    def submit(req: SpecRequest, u: Caller, dry_run: bool = False) -> SubmitAnswer | DryRunAnswer:
        req = req.model_copy(update={"app": None})  # only app submit names its app
        if dry_run:
            return service.submissions.dry_run(req, u)
        return service.submissions.submit(req, u)

    @app.post("/api/workflow/{workflow_id}/resubmit", response_model=None)
    def resubmit(
        workflow_id: str, u: Caller, req: SpecRequest | None = None, dry_run: bool = False
    ) -> SubmitAnswer | DryRunAnswer:
        return service.submissions.resubmit(workflow_id, u, req, dry_run=dry_run)

    @app.get("/api/workflow")
    def list_workflows(
        u: Caller,
        status: Annotated[list[str] | None, Query()] = None,
        name: str | None = None,
        label: Annotated[list[str] | None, Query()] = None,
        count: int | None = None,
        user: Annotated[list[str] | None, Query()] = None,
        pool: Annotated[list[str] | None, Query()] = None,
        offset: int = 0,
        order: Literal["asc", "desc"] = "desc",
        submitted_after_s: float | None = None,
        submitted_before_s: float | None = None,
        all_users: bool | None = None,
        tag: Annotated[list[str] | None, Query()] = None,
        priority: Annotated[list[str] | None, Query()] = None,
        app_name: Annotated[str | None, Query(alias="app")] = None,
        no_label: Annotated[list[str] | None, Query()] = None,
    ) -> Sequence[Mapping[str, Any]]:  # answers.WorkflowSummary
        labels = dict(item.split("=", 1) for item in (label or []) if "=" in item)
        filters = ListFilters(
            tags=tag or [], priorities=priority or [], app=app_name, no_labels=no_label or []
        )
        return service.reads.list_workflows(
            u,
            statuses=status,
            name=name,
            labels=labels,
            count=count,
            submitted_by=user,
            pool=pool,
            offset=offset,
            oldest_first=order == "asc",
            submitted_after_s=submitted_after_s,
            submitted_before_s=submitted_before_s,
            all_users=all_users,
            filters=filters,
        )

    @app.get("/api/tag")
    def tags(u: Caller) -> list[str]:
        """OSMO's ``workflow tag`` without ``-w``: the tags in use."""
        return service.reads.tags(u)

    @app.post("/api/tag", response_model=None)
    def tag(req: TagRequest, u: Caller) -> list[TagAnswer]:
        """OSMO's ``workflow tag -w ID... --add T... --remove T...``."""
        return service.control.tag(req.workflows, u, add=req.add, remove=req.remove)

    @app.get("/api/workflow/{workflow_id}")
    def query(
        workflow_id: str,
        u: Caller,
        response: Response,
        verbose: bool = False,
        wait_s: float = 0.0,
        known: str | None = None,
        isolation: bool = False,
    ) -> Mapping[str, Any]:  # answers.WorkflowAnswer
        data, key = service.reads.query_when_changed(
            workflow_id, u, known=known, wait_s=wait_s, verbose=verbose, isolation=isolation
        )
        response.headers[PROGRESS_HEADER] = key
        return data

    @app.get("/api/workflow/{workflow_id}/spec", response_class=PlainTextResponse)
    def stored_spec(workflow_id: str, u: Caller, template: bool = False) -> str:
        return service.submissions.stored_spec(workflow_id, u, template=template)

    @app.get("/api/workflow/{workflow_id}/logs")
    def logs(
        workflow_id: str,
        u: Caller,
        task: str | None = None,
        retry_id: int | None = None,
        follow: bool = False,
        lines: Annotated[int | None, Query(ge=1)] = None,
        error: bool = False,
        verbose: bool = False,
        fmt: Annotated[Literal["text", "json"], Query(alias="format")] = "text",
    ) -> Any:
        media = "application/x-ndjson" if fmt == "json" else "text/plain"
        readers: LogReaders = app.state.log_readers
        if not follow:
            stream = service.logs.read(
                workflow_id,
                u,
                task=task,
                retry_id=retry_id,
                last_lines=lines,
                failed_only=error,
                verbose=verbose,
            )
            return StreamingResponse(
                iterate_in_readers(_log_chunks(stream, fmt), readers), media_type=media
            )
        cursor = service.logs.open_follow(
            workflow_id,
            u,
            task=task,
            retry_id=retry_id,
            last_lines=lines,
            failed_only=error,
            verbose=verbose,
        )
        slots: StreamSlots = app.state.stream_slots
        slots.take(u.name)  # 429 beyond the user's cap, before the answer starts
        render = json_lines if fmt == "json" else text_lines
        return SlotResponse(
            follow_chunks(cursor, render, readers, feeds=app.state.log_feeds),
            slots,
            u.name,
            media_type=media,
        )

    @app.get("/api/workflow/{workflow_id}/events", response_model=None)
    def events(workflow_id: str, u: Caller) -> list[EventAnswer]:
        return service.reads.events(workflow_id, u)

    @app.get("/api/task", response_model=None)
    def tasks(
        u: Caller,
        workflow: str | None = None,
        count: Annotated[int, Query(ge=1)] = 20,
        osmo: bool = False,
        user: Annotated[list[str] | None, Query()] = None,
        all_users: bool = False,
        pool: Annotated[list[str] | None, Query()] = None,
        status: Annotated[list[str] | None, Query()] = None,
        node: Annotated[list[str] | None, Query()] = None,
        started_after_s: float | None = None,
        started_before_s: float | None = None,
        priority: Annotated[list[str] | None, Query()] = None,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> list[TaskRowAnswer]:
        """Tasks; with ``osmo``, OSMO's ``task list`` filters and ``count`` tasks."""
        filters = (
            TaskFilters(
                users=user or [],
                all_users=all_users,
                pools=pool or [],
                statuses=status or [],
                nodes=node or [],
                started_after_s=started_after_s,
                started_before_s=started_before_s,
                priorities=priority or [],
                offset=offset,
            )
            if osmo
            else None
        )
        return service.reads.tasks(u, workflow_id=workflow, count=count, filters=filters)

    @app.post("/api/workflow/{workflow_id}/cancel", response_model=None)
    def cancel(
        workflow_id: str, u: Caller, message: str | None = None, force: bool = False
    ) -> CancelAnswer:
        return service.control.cancel(workflow_id, u, message=message, force=force)

    @app.post("/api/workflow/{workflow_id}/task/{task}/entry", response_model=None)
    def task_entry(
        workflow_id: str, task: str, u: Caller, retry_id: int | None = None
    ) -> TaskEntryAnswer:
        """How the CLI enters a running task (``workflow exec|port-forward|rsync``)."""
        return service.control.task_entry(workflow_id, task, u, retry_id=retry_id)

    @app.post("/api/workflow/delete", response_model=None)
    def delete(req: DeleteRequest, u: Caller) -> DeleteAnswer:
        return service.control.delete(req.ids, u)

    @app.post("/api/workflow/prune", response_model=None)
    def prune(req: PruneRequest, u: Caller) -> PruneAnswer:
        return service.control.prune(req.older_than_s, u, dry_run=req.dry_run, limit=req.limit)

    @app.post("/api/workflow/{workflow_id}/restart", response_model=None)
    def restart(workflow_id: str, u: Caller, pool: str | None = None) -> WorkflowSummary:
        return service.control.restart(workflow_id, u, pool=pool)

    @app.post("/api/credentials/{name}", response_model=None)
    def set_credential(name: str, req: CredentialRequest, u: Caller) -> CredentialAnswer:
        return service.credentials.save(u, name, req.type, req.payload)

    @app.get("/api/credentials", response_model=None)
    def list_credentials(u: Caller) -> list[CredentialAnswer]:
        return service.credentials.list_for(u)

    @app.delete("/api/credentials/{name}", response_model=None)
    def delete_credential(name: str, u: Caller) -> DeletedAnswer:
        return service.credentials.delete(u, name)

    @app.get("/api/pool", response_model=None)
    def pools(_u: Caller) -> list[PoolAnswer]:
        return service.pools.summaries()

    @app.post("/api/pool/reload", response_model=None)
    def reload_pools(_u: Caller) -> PoolReloadAnswer:
        return service.pools.refresh(force=True)

    @app.get("/api/resource", response_model=None)
    def resources(_u: Caller, pool: str | None = None) -> list[ResourceAnswer]:
        return service.pools.resources(pool)


DESCRIPTION_KEY = "../trainyard:description"
"""Where an app version's description (OSMO's ``app create -d``) is kept: a key of its
``files`` that no ``localpath`` can be (a localpath lies below the spec's folder, never
``..``), so the store keeps its shape. (Not a NUL: PostgreSQL's JSON stores none.)"""


def _app_json(a: AppRecord, *, spec: bool = False) -> AppAnswer:
    out: AppAnswer = {
        "name": a.name,
        "version": a.version,
        "owner": a.owner,
        "description": a.files.get(DESCRIPTION_KEY, ""),
        "create_time": iso(a.create_time_s),
    }
    if spec:
        out["spec"] = a.spec_text
    return out


def _spec_files(a: AppRecord) -> dict[str, str]:
    """An app version's ``localpath`` files, without its description."""
    return {k: v for k, v in a.files.items() if k != DESCRIPTION_KEY}


def _app_routes(app: FastAPI, service: Service) -> None:
    store = service.engine.store

    @app.post("/api/app/{name}", response_model=None)
    def create(name: str, req: AppRequest, u: Caller, update: bool = False) -> AppAnswer:
        """A new version of app ``name`` (``update``: the app must exist, OSMO's ``app
        update``); the description is the given one, else the latest version's."""
        refuse_task_token(u, "create an app")
        check_app_name(name)
        owner = _app_owner(store, name, u, "add a version to")
        latest = _latest_app(store, name)
        if update and latest is None:
            store.get_app(name)  # raises NotFoundError, naming the command that lists them
        loaded = service.submissions.load(
            SpecRequest(
                spec_text=req.spec_text,
                files=req.files,
                spec_name=name,
                set=req.set,
                set_string=req.set_string,
            )
        )
        description = (
            req.description
            if req.description is not None
            else (latest.files.get(DESCRIPTION_KEY, "") if latest else "")
        )
        rec = store.create_app(
            name, owner, req.spec_text, {**req.files, DESCRIPTION_KEY: description}
        )
        return {**_app_json(rec), "warnings": loaded.warnings_json()}

    @app.get("/api/app", response_model=None)
    def list_apps(
        u: Caller,
        name: str | None = None,
        user: Annotated[list[str] | None, Query()] = None,
        all_users: bool = True,
    ) -> list[AppAnswer]:
        """The latest version of every app, by name; ``name``: names containing it;
        ``user``: apps of these owners; without ``all_users``, the caller's own."""
        owners = set(user or ([] if all_users else [u.name]))
        return [
            _app_json(a)
            for a in store.list_apps()
            if (not name or name in a.name) and (not owners or a.owner in owners)
        ]

    @app.get("/api/app/{name}", response_model=None)
    def show(name: str, _u: Caller, version: int | None = None) -> AppAnswer:
        return _app_json(store.get_app(name, version), spec=True)

    @app.get("/api/app/{name}/versions", response_model=None)
    def versions(name: str, _u: Caller) -> list[AppAnswer]:
        """Every version of the app, oldest first (OSMO's ``app info``)."""
        return [_app_json(a) for a in store.app_versions(name)]

    @app.post("/api/app/{name}/rename", response_model=None)
    def rename(name: str, req: RenameRequest, u: Caller) -> AppRenamedAnswer:
        refuse_task_token(u, "rename an app")
        check_app_name(req.new_name)
        _app_owner(store, name, u, "rename")
        store.get_app(name)
        return {"name": req.new_name, "renamed_versions": store.rename_app(name, req.new_name)}

    @app.post("/api/app/{name}/submit", response_model=None)
    def submit_app(
        name: str, req: SpecRequest, u: Caller, version: int | None = None, dry_run: bool = False
    ) -> SubmitAnswer | DryRunAnswer:
        """Submit an app version; ``files`` in the request (``app submit --local-path``)
        replace the stored copies of those ``localpath`` files."""
        refuse_task_token(u, "submit a workflow")
        a = store.get_app(name, version)
        full = req.model_copy(
            update={
                "spec_text": a.spec_text,
                "files": {**_spec_files(a), **req.files},
                "spec_name": f"{a.name}:{a.version}",
                "app": f"{a.name}:{a.version}",
            }
        )
        return (
            service.submissions.dry_run(full, u) if dry_run else service.submissions.submit(full, u)
        )

    @app.delete("/api/app/{name}", response_model=None)
    def delete(name: str, u: Caller, version: int | None = None) -> AppDeletedAnswer:
        """Delete every version of the app, or with ``version`` that one only."""
        refuse_task_token(u, "delete an app")
        _app_owner(store, name, u, "delete")
        return {
            "name": name,
            "version": version,
            "deleted_versions": store.delete_app(name, version),
        }


def _latest_app(store: Store, name: str) -> AppRecord | None:
    try:
        return store.get_app(name)
    except NotFoundError:
        return None


def _app_owner(store: Store, name: str, user: User, action: str) -> str:
    """Who owns app ``name`` once ``user`` acts on it: its owner (an existing app keeps
    its owner, whoever adds a version), or ``user`` for a new name.

    Raises:
        ForbiddenError: the app exists, belongs to someone else, and ``user`` is no admin.
    """
    try:
        owner = store.get_app(name).owner
    except NotFoundError:
        return user.name
    if not user.admin and owner != user.name:
        raise ForbiddenError(
            f"app {name} belongs to {owner}; only they or an admin may {action} it"
        )
    return owner


LOG_CHUNK_BYTES = 64 * 1024
"""About how much log text goes out per chunk of a streamed answer (one thread hop each)."""


def _log_chunks(lines: Iterator[LogLine | None], fmt: str) -> Iterator[str]:
    """Log lines with their newlines, OSMO's text or one JSON object each (JSON Lines),
    joined into chunks of about ``LOG_CHUNK_BYTES``; a None in ``lines`` (the follow
    stream's ``FLUSH``) sends what is batched at once."""
    batch: list[str] = []
    size = 0
    for line in lines:
        if line is not None:
            text = (json.dumps(line.to_json()) if fmt == "json" else line.text) + "\n"
            batch.append(text)
            size += len(text)
            if size < LOG_CHUNK_BYTES:
                continue
        if batch:
            yield "".join(batch)
            batch, size = [], 0
    if batch:
        yield "".join(batch)
