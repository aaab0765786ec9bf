"""Persistence: SQLite under ``$TRAINYARD_HOME`` by default, PostgreSQL (or any SQLAlchemy
URL) by ``TRAINYARD_DATABASE_URL``.

The store is the one truth. A workflow row carries its searchable columns (name, status,
pool, submitter, labels, times) and the engine's whole ``WorkflowState`` as JSON; every state
change is one transaction (``save_state``), so a killed engine leaves either the old or the
new state, never half of one. Apps (named, versioned templates) live beside workflows.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    delete,
    event,
    false,
    func,
    select,
    text,
    update,
)
from sqlalchemy.engine import CursorResult, Result, make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from trainyard.errors import NotFoundError, RefusedError, StoreError
from trainyard.store.lock import NO_DRIVER, PG_LOCK_KEY, shown_url, with_driver

__all__ = ["Store", "WorkflowRecord", "AppRecord", "default_url"]

PG_WRITER_KEY = PG_LOCK_KEY + 1
"""The PostgreSQL transaction advisory lock that serializes the transactions which number
things (a workflow's id and ``seq``, an app's version) and the creation of the schema."""


class _Base(DeclarativeBase):
    pass


class _Workflow(_Base):
    __tablename__ = "workflows"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, index=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    status: Mapped[str] = mapped_column(String(40), index=True)
    pool: Mapped[str] = mapped_column(String(200))
    submitted_by: Mapped[str] = mapped_column(String(200), index=True)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    submit_time_s: Mapped[float] = mapped_column(Float)
    end_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    spec_text: Mapped[str] = mapped_column(Text)
    source: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)


class _Counter(_Base):
    __tablename__ = "workflow_counters"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    next_number: Mapped[int] = mapped_column(Integer, default=1)


class _Meta(_Base):
    """Facts about the store itself (``identity``), one row each."""

    __tablename__ = "store_meta"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[str] = mapped_column(String(200))


class _App(_Base):
    __tablename__ = "apps"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    owner: Mapped[str] = mapped_column(String(200))
    spec_text: Mapped[str] = mapped_column(Text)
    files: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    create_time_s: Mapped[float] = mapped_column(Float)
    deleted: Mapped[int] = mapped_column(Integer, default=0)


class _Credential(_Base):
    """A user's credential: its payload encrypted (``store.credentials``)."""

    __tablename__ = "credentials"
    __table_args__ = (UniqueConstraint("user", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    user: Mapped[str] = mapped_column(String(200), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(20))
    token: Mapped[str] = mapped_column(Text)
    create_time_s: Mapped[float] = mapped_column(Float)


@dataclass(frozen=True)
class WorkflowRecord:
    """A stored workflow as the rest of trainyard sees it (times in Unix seconds)."""

    id: str
    name: str
    status: str
    pool: str
    submitted_by: str
    labels: dict[str, str]
    submit_time_s: float
    end_time_s: float | None
    spec_text: str
    source: dict[str, Any]
    state: dict[str, Any]


@dataclass(frozen=True)
class AppRecord:
    """One version of a named workflow template."""

    name: str
    version: int
    owner: str
    spec_text: str
    files: dict[str, str]
    create_time_s: float


def default_url(home: Path) -> str:
    """The SQLite URL under ``home``."""
    return f"sqlite:///{home / 'trainyard.db'}"


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


_DAMAGED = ("SQLITE_CORRUPT", "SQLITE_NOTADB")
"""SQLite's error names for a database file it cannot trust (sqlite.org/rescode.html)."""


def _is_damage(exc: SQLAlchemyError) -> bool:
    """Whether ``exc`` says the database file is damaged (not a busy or full database)."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else None
    name = str(getattr(orig, "sqlite_errorname", ""))
    text = str(orig or exc).lower()
    return name in _DAMAGED or "malformed" in text or "file is not a database" in text


def _one_line(detail: str) -> str:
    """SQLite's (possibly many-line) report as one line: its first problem and a count."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip() and not ln.startswith("***")]
    if len(lines) <= 1:
        return lines[0] if lines else "unknown damage"
    return f"{lines[0]}, and {len(lines) - 1} more problem(s)"


def _damaged_message(url: str, detail: str) -> str:
    """What to say about a damaged store, in one line: which file, what SQLite said, what
    to do."""
    path = make_url(url).database or url
    moved = shlex.quote(f"{path}.damaged")
    return (
        f"the store {path} is damaged (SQLite: {_one_line(detail)}); trainyard will not "
        f"write to it. Stop the server if one runs (`trainyard server stop`), then move "
        f"it aside (`mv {shlex.quote(path)} {moved}`, and its -wal and -shm files) so "
        f"that the next start makes an empty store, or restore a backup; "
        f"`sqlite3 {moved} .recover` may save its rows"
    )


def _make_engine(url: str) -> Any:  # noqa: ANN401 - sqlalchemy's Engine
    """The SQLAlchemy engine of the store at ``url`` (``postgresql://`` gets the psycopg
    driver). A PostgreSQL engine checks each pooled connection before a transaction uses it
    (``pool_pre_ping``), so that a database restarted under a running server costs the next
    transaction a reconnect, not an error.

    Raises:
        StoreError: the URL names a driver that is not installed (psycopg: the message says
            what to install) or cannot be parsed.
    """
    try:
        engine = create_engine(
            with_driver(url), future=True, pool_pre_ping=not url.startswith("sqlite")
        )
    except ImportError as exc:
        raise StoreError(f"{NO_DRIVER}: {exc}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot open the store at {shown_url(url)}: {exc}") from exc
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _to_record(row: _Workflow) -> WorkflowRecord:
    return WorkflowRecord(
        id=row.id,
        name=row.name,
        status=row.status,
        pool=row.pool,
        submitted_by=row.submitted_by,
        labels=dict(row.labels or {}),
        submit_time_s=row.submit_time_s,
        end_time_s=row.end_time_s,
        spec_text=row.spec_text,
        source=dict(row.source or {}),
        state=row.state,
    )


def _to_app(row: _App) -> AppRecord:
    return AppRecord(
        row.name, row.version, row.owner, row.spec_text, dict(row.files or {}), row.create_time_s
    )


class Store:
    """Transactions over the workflow and app tables.

    Args:
        url: an SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg://...``).

    Raises:
        StoreError: from any method, when the database refuses or fails (the cause chained).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.damaged: str | None = None
        """Why the store cannot be trusted, once a transaction found it damaged; from then
        on every transaction is refused (StoreError) without touching the file."""
        self._engine = _make_engine(url)
        self.dialect: str = self._engine.dialect.name
        """``sqlite`` or ``postgresql`` (or another SQLAlchemy dialect's name)."""
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        try:
            with self._engine.begin() as conn:
                if self.dialect == "postgresql":  # two servers starting at once
                    self._serialize_writers(conn)
                _Base.metadata.create_all(conn)
        except SQLAlchemyError as exc:
            if _is_damage(exc):
                raise StoreError(_damaged_message(url, str(getattr(exc, "orig", exc)))) from exc
            raise StoreError(f"cannot open the store at {shown_url(url)}: {exc}") from exc
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        """This store's own random name (32 hex digits), made (and stored) the first time
        it is asked and kept for the store's life: a store moved aside and made anew, or a
        new database, has another. What the home keeps per store (task-token key, run
        folders) is bound to it (``engine.homestore``). Read once per Store object; not at
        open, so that a damaged store still opens and ``verify`` says what is wrong.

        Raises:
            StoreError: as any transaction.
        """
        if self._identity is None:
            with self._tx() as session:
                self._serialize_writers(session)
                row = session.get(_Meta, "identity")
                if row is None:
                    row = _Meta(key="identity", value=uuid.uuid4().hex)
                    session.add(row)
                self._identity = row.value
        return self._identity

    def _serialize_writers(self, conn: Session | Any) -> None:  # noqa: ANN401 - a Connection
        """Make the transaction of ``conn`` the only one that numbers things (ids, ``seq``,
        app versions) until it ends, so that two at once never pick the same number.

        PostgreSQL: a transaction advisory lock (``pg_advisory_xact_lock``), released at
        commit or rollback. SQLite: a write that matches no row, which takes the database's
        write lock at once (``busy_timeout`` waits for it) instead of at the transaction's
        first real write, after its reads.
        """
        if self.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_WRITER_KEY})
        elif self.dialect == "sqlite":
            conn.execute(update(_Counter).where(false()).values(next_number=0))

    def verify(self) -> None:
        """Check that the store can be trusted before an engine writes to it (SQLite's
        ``PRAGMA quick_check``: every page and index readable; about a second per few
        hundred MB). Other databases check themselves.

        Raises:
            StoreError: the store is damaged; the message names the file and what to do.
        """
        if self.dialect != "sqlite":
            return
        try:
            with self._engine.connect() as conn:
                rows = [str(r[0]) for r in conn.exec_driver_sql("PRAGMA quick_check(5)")]
        except SQLAlchemyError as exc:
            raise StoreError(_damaged_message(self.url, str(getattr(exc, "orig", exc)))) from exc
        if rows != ["ok"]:
            raise StoreError(_damaged_message(self.url, "\n".join(rows)))

    @contextmanager
    def _tx(self) -> Iterator[Session]:
        if self.damaged is not None:
            raise StoreError(self.damaged)
        try:
            with self._sessions.begin() as session:
                yield session
        except SQLAlchemyError as exc:
            if _is_damage(exc):
                self.damaged = _damaged_message(self.url, str(getattr(exc, "orig", exc)))
                raise StoreError(self.damaged) from exc
            raise StoreError(f"store transaction failed: {exc}") from exc

    # ------------------------------------------------------------------ workflows

    def next_workflow_id(self, session: Session, name: str) -> tuple[str, int]:
        """Take the next id (``NAME-N``) and ``seq`` in ``session``'s transaction, which
        must have called ``_serialize_writers`` first."""
        counter = session.get(_Counter, name)
        if counter is None:
            counter = _Counter(name=name, next_number=1)
            session.add(counter)
        number = counter.next_number
        counter.next_number = number + 1
        seq = (session.scalar(select(func.max(_Workflow.seq))) or 0) + 1
        return f"{name}-{number}", seq

    def peek_workflow_id(self, name: str) -> str:
        """The id the next workflow named ``name`` would get now (nothing is reserved)."""
        with self._tx() as session:
            counter = session.get(_Counter, name)
            return f"{name}-{counter.next_number if counter is not None else 1}"

    def create_workflow(
        self,
        *,
        name: str,
        pool: str,
        submitted_by: str,
        labels: dict[str, str],
        spec_text: str,
        source: dict[str, Any],
        make_state: Any,
    ) -> WorkflowRecord:
        """Store a new workflow in one transaction and return it.

        ``make_state(workflow_id) -> (status, state_dict)`` builds the initial state once the id
        (OSMO's ``NAME-N``) is known; if it raises, nothing is stored.
        """
        with self._tx() as session:
            self._serialize_writers(session)
            workflow_id, seq = self.next_workflow_id(session, name)
            status, state = make_state(workflow_id)
            row = _Workflow(
                id=workflow_id,
                seq=seq,
                name=name,
                status=status,
                pool=pool,
                submitted_by=submitted_by,
                labels=labels,
                submit_time_s=time.time(),
                end_time_s=None,
                spec_text=spec_text,
                source=source,
                state=state,
            )
            session.add(row)
            session.flush()
            return _to_record(row)

    def get_workflow(self, workflow_id: str) -> WorkflowRecord:
        """The workflow ``workflow_id``. Raises NotFoundError if there is none."""
        with self._tx() as session:
            row = session.get(_Workflow, workflow_id)
            if row is None:
                raise NotFoundError(
                    f"no workflow {workflow_id!r}; `trainyard workflow list` shows the ids"
                )
            return _to_record(row)

    def save_states(self, updates: dict[str, tuple[str, float | None, dict[str, Any]]]) -> None:
        """Write several workflows' (status, end time, state) in ONE transaction."""
        if not updates:
            return
        with self._tx() as session:
            for workflow_id, (status, end_time_s, state) in updates.items():
                row = session.get(_Workflow, workflow_id)
                if row is None:
                    raise StoreError(f"workflow {workflow_id!r} vanished from the store")
                row.status, row.end_time_s, row.state = status, end_time_s, state

    def list_workflows(
        self,
        *,
        statuses: list[str] | None = None,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        submitted_by: str | None = None,
        count: int | None = None,
        active_only: bool = False,
        ended_since_s: float | None = None,
        ended_before_s: float | None = None,
    ) -> list[WorkflowRecord]:
        """Workflows, newest first, filtered; ``labels`` must all match exactly;
        ``ended_since_s`` (Unix seconds) keeps those that ended at or after it,
        ``ended_before_s`` those that ended before it."""
        query = select(_Workflow).order_by(_Workflow.seq.desc())
        if statuses:
            query = query.where(_Workflow.status.in_(statuses))
        if name:
            query = query.where(_Workflow.name.contains(name))
        if submitted_by:
            query = query.where(_Workflow.submitted_by == submitted_by)
        if active_only:
            query = query.where(_Workflow.end_time_s.is_(None))
        if ended_since_s is not None:
            query = query.where(_Workflow.end_time_s >= ended_since_s)
        if ended_before_s is not None:
            query = query.where(_Workflow.end_time_s < ended_before_s)
        with self._tx() as session:
            rows = [_to_record(r) for r in session.scalars(query)]
        rows = [r for r in rows if _labels_match(r.labels, labels or {})]
        return rows[:count] if count else rows

    def delete_workflows(self, workflow_ids: list[str]) -> int:
        """Delete these workflows' rows in one transaction (their run folders are the
        caller's); returns how many existed. Only for workflows that have ended."""
        if not workflow_ids:
            return 0
        with self._tx() as session:
            done = _dml(session.execute(delete(_Workflow).where(_Workflow.id.in_(workflow_ids))))
            return int(done.rowcount or 0)

    def known_workflow_ids(self, workflow_ids: list[str]) -> set[str]:
        """Those of ``workflow_ids`` that this store holds (asked 500 at a time)."""
        known: set[str] = set()
        for start in range(0, len(workflow_ids), 500):
            chunk = workflow_ids[start : start + 500]
            with self._tx() as session:
                known.update(session.scalars(select(_Workflow.id).where(_Workflow.id.in_(chunk))))
        return known

    def workflow_end_times(self, workflow_ids: list[str]) -> dict[str, tuple[str, float | None]]:
        """``{id: (submitted_by, end_time_s)}`` of those of ``workflow_ids`` that exist (no
        state loaded: cheap for the retention sweep)."""
        query = select(_Workflow.id, _Workflow.submitted_by, _Workflow.end_time_s)
        with self._tx() as session:
            rows = session.execute(query.where(_Workflow.id.in_(workflow_ids))).all()
        return {r[0]: (r[1], r[2]) for r in rows}

    def page_workflows(
        self,
        *,
        statuses: list[str] | None = None,
        name: str | None = None,
        labels: dict[str, str] | None = None,
        submitted_by: str | list[str] | None = None,
        pool: str | list[str] | None = None,
        offset: int = 0,
        limit: int = 50,
        submitted_after_s: float | None = None,
        submitted_before_s: float | None = None,
        oldest_first: bool = False,
        keep: Callable[[dict[str, Any]], bool] | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of workflow summaries, newest first (``oldest_first``: oldest first),
        and how many match in all (for the dashboard and ``workflow list``: only the summary
        columns are read, never a spec or a state, and the ``seq`` index gives the order, so
        a page costs the same with 10 or 10,000 rows). ``submitted_after_s`` keeps those
        submitted at or after it, ``submitted_before_s`` those before it (Unix seconds).
        ``submitted_by`` and ``pool`` take one value or a list (any of them matches).
        ``keep`` (OSMO's filters on what a workflow's ``source`` holds: tags, priority,
        app) is asked of each row that the other filters match, with its ``source`` under
        ``"source"``; the page is then cut from the rows it kept (every match is read).

        Returns:
            ``([{"id", "name", "status", "pool", "submitted_by", "labels",
            "submit_time_s", "end_time_s"}], total)``.
        """
        keys = [
            "id",
            "name",
            "status",
            "pool",
            "submitted_by",
            "labels",
            "submit_time_s",
            "end_time_s",
        ]
        columns = [
            _Workflow.id,
            _Workflow.name,
            _Workflow.status,
            _Workflow.pool,
            _Workflow.submitted_by,
            _Workflow.labels,
            _Workflow.submit_time_s,
            _Workflow.end_time_s,
        ]
        if keep is not None:
            keys.append("source")
            columns.append(_Workflow.source)
        conditions = _page_conditions(
            statuses=statuses,
            name=name,
            labels=labels,
            submitted_by=submitted_by,
            pool=pool,
            submitted_after_s=submitted_after_s,
            submitted_before_s=submitted_before_s,
        )
        order = _Workflow.seq.asc() if oldest_first else _Workflow.seq.desc()
        rows_q = select(*columns).where(*conditions).order_by(order)
        if keep is not None:
            with self._tx() as session:
                every = [dict(zip(keys, row, strict=True)) for row in session.execute(rows_q).all()]
            kept = [row for row in every if keep(row)]
            page = kept[max(offset, 0) : max(offset, 0) + max(limit, 1)]
            return [{k: v for k, v in row.items() if k != "source"} for row in page], len(kept)
        count_q = select(func.count()).select_from(_Workflow).where(*conditions)
        with self._tx() as session:
            total = session.scalar(count_q) or 0
            rows = session.execute(rows_q.offset(max(offset, 0)).limit(max(limit, 1))).all()
        return [dict(zip(keys, row, strict=True)) for row in rows], total

    def update_workflow_source(
        self, workflow_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> dict[str, Any]:
        """Replace workflow ``workflow_id``'s ``source`` by ``change(source)`` in one
        transaction (OSMO's tags live there); the new ``source``.

        Raises:
            NotFoundError: no such workflow.
        """
        with self._tx() as session:
            row = session.get(_Workflow, workflow_id)
            if row is None:
                raise NotFoundError(f"no workflow {workflow_id}")
            row.source = change(dict(row.source or {}))
            return dict(row.source)

    # ------------------------------------------------------------------ apps

    def create_app(self, name: str, owner: str, spec_text: str, files: dict[str, str]) -> AppRecord:
        """Add a new version of app ``name`` (version 1 for a new name).

        Raises:
            RefusedError: ``name`` or ``owner`` is longer than the column (200 characters),
                or a text holds a NUL character (PostgreSQL stores none): refused the same
                way on every database, before the transaction.
        """
        _storable("app name", name, NAME_CHARS)
        _storable("app owner", owner, NAME_CHARS)
        _storable("app spec", spec_text, None)
        with self._tx() as session:
            self._serialize_writers(session)
            latest = session.scalar(select(func.max(_App.version)).where(_App.name == name))
            row = _App(
                name=name,
                version=(latest or 0) + 1,
                owner=owner,
                spec_text=spec_text,
                files=files,
                create_time_s=time.time(),
                deleted=0,
            )
            session.add(row)
            session.flush()
            return _to_app(row)

    def get_app(self, name: str, version: int | None = None) -> AppRecord:
        """The app's latest (or given) version. Raises NotFoundError."""
        query = select(_App).where(_App.name == name, _App.deleted == 0)
        query = query.where(_App.version == version) if version else query
        with self._tx() as session:
            row = session.scalars(query.order_by(_App.version.desc())).first()
            if row is None:
                raise NotFoundError(f"no app {name!r}; `trainyard app list` shows the apps")
            return _to_app(row)

    def list_apps(self) -> list[AppRecord]:
        """The latest version of every app, by name."""
        with self._tx() as session:
            rows = session.scalars(
                select(_App).where(_App.deleted == 0).order_by(_App.name, _App.version.desc())
            ).all()
        latest: dict[str, AppRecord] = {}
        for row in rows:
            latest.setdefault(row.name, _to_app(row))
        return list(latest.values())

    def delete_app(self, name: str, version: int | None = None) -> int:
        """Delete every version of app ``name`` (with ``version``: that one only); returns
        how many. Raises NotFoundError."""
        query = select(_App).where(_App.name == name, _App.deleted == 0)
        if version is not None:
            query = query.where(_App.version == version)
        with self._tx() as session:
            rows = session.scalars(query).all()
            if not rows:
                which = f"app {name!r}" + (f" version {version}" if version else "")
                raise NotFoundError(f"no {which}; `trainyard app list` shows the apps")
            for row in rows:
                row.deleted = 1
            return len(rows)

    def app_versions(self, name: str) -> list[AppRecord]:
        """Every version of app ``name``, oldest first. Raises NotFoundError."""
        with self._tx() as session:
            rows = session.scalars(
                select(_App).where(_App.name == name, _App.deleted == 0).order_by(_App.version)
            ).all()
            if not rows:
                raise NotFoundError(f"no app {name!r}; `trainyard app list` shows the apps")
            return [_to_app(row) for row in rows]

    def rename_app(self, name: str, new_name: str) -> int:
        """Give every version of app ``name`` the name ``new_name``; how many.

        Raises:
            NotFoundError: no app ``name``.
            RefusedError: an app ``new_name`` exists.
        """
        with self._tx() as session:
            taken = session.scalar(
                select(func.count())
                .select_from(_App)
                .where(_App.name == new_name, _App.deleted == 0)
            )
            if taken:
                raise RefusedError(f"an app {new_name!r} exists already; pick another name")
            rows = session.scalars(select(_App).where(_App.name == name)).all()
            if not any(row.deleted == 0 for row in rows):
                raise NotFoundError(f"no app {name!r}; `trainyard app list` shows the apps")
            for row in rows:
                row.name = new_name
            return sum(row.deleted == 0 for row in rows)

    # ------------------------------------------------------------------ credentials

    def put_credential(self, user: str, name: str, kind: str, token: str) -> None:
        """Create or replace ``user``'s credential ``name`` (``token``: the encrypted
        payload, ``store.credentials``)."""
        with self._tx() as session:
            row = session.scalars(
                select(_Credential).where(_Credential.user == user, _Credential.name == name)
            ).first()
            if row is None:
                session.add(
                    _Credential(
                        user=user, name=name, kind=kind, token=token, create_time_s=time.time()
                    )
                )
            else:
                row.kind, row.token, row.create_time_s = kind, token, time.time()

    def credential_rows(self, user: str) -> list[tuple[str, str, str, float]]:
        """``user``'s credentials as ``(name, type, encrypted payload, create_time_s)``, by
        name."""
        query = select(
            _Credential.name, _Credential.kind, _Credential.token, _Credential.create_time_s
        ).where(_Credential.user == user)
        with self._tx() as session:
            rows = session.execute(query.order_by(_Credential.name)).all()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def delete_credential(self, user: str, name: str) -> bool:
        """Delete ``user``'s credential ``name``; returns whether it existed."""
        with self._tx() as session:
            done = _dml(
                session.execute(
                    delete(_Credential).where(_Credential.user == user, _Credential.name == name)
                )
            )
            return bool(done.rowcount)


NAME_CHARS = 200
"""The length of the store's name columns (``String(200)``): PostgreSQL refuses longer
values, SQLite would keep them."""


def _storable(what: str, value: str, max_chars: int | None) -> None:
    """Refuse (RefusedError) a text that one of the databases would not store as given."""
    if "\x00" in value:
        raise RefusedError(f"{what} {value[:40]!r} holds a NUL character; remove it")
    if max_chars is not None and len(value) > max_chars:
        raise RefusedError(
            f"{what} {value[:40]!r}... is {len(value)} characters long; at most {max_chars}"
        )


def _labels_match(have: dict[str, str], want: dict[str, str]) -> bool:
    return all(have.get(k) == v for k, v in want.items())


def _page_conditions(
    *,
    statuses: list[str] | None,
    name: str | None,
    labels: dict[str, str] | None,
    submitted_by: str | list[str] | None,
    pool: str | list[str] | None,
    submitted_after_s: float | None,
    submitted_before_s: float | None,
) -> list[Any]:
    """The SQL conditions of ``Store.page_workflows``' column filters."""
    conditions: list[Any] = []
    if statuses:
        conditions.append(_Workflow.status.in_(statuses))
    if name:
        conditions.append(_Workflow.name.contains(name))
    users = [submitted_by] if isinstance(submitted_by, str) else list(submitted_by or [])
    if users:
        conditions.append(_Workflow.submitted_by.in_(users))
    pools = [pool] if isinstance(pool, str) else list(pool or [])
    if pools:
        conditions.append(_Workflow.pool.in_(pools))
    for key, value in (labels or {}).items():
        conditions.append(_Workflow.labels[key].as_string() == value)
    if submitted_after_s is not None:
        conditions.append(_Workflow.submit_time_s >= submitted_after_s)
    if submitted_before_s is not None:
        conditions.append(_Workflow.submit_time_s < submitted_before_s)
    return conditions


def _dml(result: Result[Any]) -> CursorResult[Any]:
    """The result of a DELETE or UPDATE, with its ``rowcount`` (SQLAlchemy types every
    ``Session.execute`` as a plain ``Result``; a DML statement's is a ``CursorResult``)."""
    return cast("CursorResult[Any]", result)
