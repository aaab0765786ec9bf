"""Exactly one engine per store: an exclusive lock held for the engine's whole life.

A store in a file (SQLite): ``fcntl.flock`` on ``<database file>.lock`` beside it. A PostgreSQL
store: a session advisory lock (``pg_try_advisory_lock``) on a connection kept open, its
``application_name`` naming the holder's pid and host. The OS (or the database) drops the lock
when its process dies, ``kill -9`` included. The holder writes a JSON note (``{"pid", ...}``)
into the lock file, trusted only while the lock is held (``holder``). ``FileLock`` is also the
server's lock on ``$TRAINYARD_HOME/server.lock`` (``server.process``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from trainyard.errors import EngineLockedError, StoreError


def make_url(url: str) -> Any:  # noqa: ANN401 - sqlalchemy's URL
    """``sqlalchemy.engine.make_url``, imported when first used: the CLI looks for the
    server's lock on every start and must not pay for SQLAlchemy there."""
    from sqlalchemy.engine import make_url as parse

    return parse(url)


__all__ = [
    "FileLock",
    "HeldLock",
    "flock_within",
    "holder",
    "store_lock_path",
    "acquire_store_lock",
    "PG_LOCK_KEY",
    "NO_DRIVER",
    "PgLock",
    "with_driver",
    "shown_url",
]

PG_LOCK_KEY = 0x7472_6179  # "tray": the advisory lock key of a trainyard engine
"""The key of the PostgreSQL session advisory lock one engine holds on its store."""

NO_DRIVER = (
    "a PostgreSQL store needs the psycopg driver: pip install 'trainyard[postgres]' "
    "(or 'psycopg[binary]')"
)
"""The start of the StoreError raised when psycopg is not installed."""

PG_DRIVER = "postgresql+psycopg"
"""The SQLAlchemy dialect and driver of a PostgreSQL store: psycopg 3 (the ``postgres``
extra). SQLAlchemy's default for ``postgresql://`` is psycopg2, which trainyard does not use."""


def with_driver(url: str) -> str:
    """``url`` with trainyard's PostgreSQL driver named: ``postgresql://...`` and
    ``postgres://...`` (as libpq and most hosting services write it) become
    ``postgresql+psycopg://...``; any other URL, a driver already named included, is
    returned unchanged."""
    parsed = make_url(
        url.replace("postgres://", "postgresql://", 1) if url.startswith("postgres://") else url
    )
    if parsed.drivername != "postgresql":
        return url
    return str(parsed.set(drivername=PG_DRIVER).render_as_string(hide_password=False))


def shown_url(url: str) -> str:
    """``url`` as it may be printed or logged: its password masked."""
    try:
        return str(make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - an unparsable URL: show none of it
        return "<unparsable database URL>"


def flock_within(fd: int, wait_s: float, poll_s: float = 0.05) -> bool:
    """Take an exclusive ``flock(2)`` on ``fd``, trying every ``poll_s`` for at most
    ``wait_s`` seconds (0: one try). Returns whether it was taken; the caller keeps ``fd``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


class HeldLock(Protocol):
    """A lock held until ``release`` (or the process's end)."""

    def release(self) -> None: ...


def _read_note(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 65536)
    try:
        note = json.loads(raw.decode() or "{}")
    except (ValueError, UnicodeDecodeError):
        return {}
    return note if isinstance(note, dict) else {}


class FileLock:
    """An exclusive ``flock`` on a file, held while this object (its descriptor) lives.

    The descriptor is close-on-exec (never inherited by the processes the holder starts),
    so only the holder's own death or ``release`` frees the lock.
    """

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, path: Path, *, what: str, wait_s: float = 0.0) -> FileLock:
        """Take the lock on ``path`` (created if absent) and write ``{"pid"}`` in it.

        Args:
            what: what the lock guards, for the error (``"the store /x/trainyard.db"``).
            wait_s: how long to keep trying while it is held (others only peek at it for
                microseconds; a real holder holds it for its whole life).

        Raises:
            EngineLockedError: another process holds it; the message names its pid.
            StoreError: ``path`` is a symbolic link or not a regular file (a link
                planted there would make the holder truncate the file it points to).
        """
        fd = _open_lock_file(path, os.O_RDWR | os.O_CREAT)
        if not flock_within(fd, wait_s):
            note = _read_note(fd)
            os.close(fd)
            raise EngineLockedError(_held_message(what, path, note))
        lock = cls(path, fd)
        lock.note({"pid": os.getpid(), "host": socket.gethostname()})
        return lock

    def note(self, data: dict[str, Any]) -> None:
        """Replace the holder's note (JSON object) in the lock file."""
        if self._fd is None:
            raise RuntimeError("the lock was released")
        raw = json.dumps(data).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, raw, 0)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _open_lock_file(path: Path, flags: int) -> int:
    """``path`` opened with ``flags``, never through a symbolic link (``O_NOFOLLOW``) and only
    when it is a regular file (a FIFO or device is not opened for writing).

    Raises:
        StoreError: a link or another kind of file is at ``path``; FileNotFoundError as
            ``os.open`` without ``O_CREAT``.
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        fd = -1
    if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    if fd >= 0:
        os.close(fd)
    raise StoreError(
        f"lock file {path} is a symbolic link or not a regular file; a lock is "
        "never taken through one (it would write where the link points): remove "
        "it and start again"
    )


def _held_message(what: str, path: Path, note: dict[str, Any]) -> str:
    pid = note.get("pid")
    who = f"pid {pid}" if pid else "another process"
    if note.get("host") and note.get("host") != socket.gethostname():
        who += f" on {note['host']}"
    return (
        f"{what} is in use by another trainyard server ({who}; lock {path}); only one "
        "engine may drive a store. Use that server (`trainyard server status`) or stop it "
        "first (`trainyard server stop`)"
    )


def holder(path: Path) -> dict[str, Any] | None:
    """Who holds the lock on ``path`` now: their note (``{}`` until they wrote it), or None
    when nobody holds it (no file, or the lock is free). Never blocks; peeks by taking and
    dropping the lock at once when it is free."""
    try:
        fd = _open_lock_file(path, os.O_RDWR)
    except (FileNotFoundError, StoreError):
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_note(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def store_lock_path(url: str) -> Path | None:
    """``<database file>.lock`` beside the database file with its symbolic links resolved
    (a store reached through a linked path must not get a lock of its own, or two engines
    would drive one store); None for other URLs (and for an in-memory SQLite database, private to
    its process anyway)."""
    parsed = make_url(url)
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return None
    real = Path(os.path.realpath(database))
    return real.with_name(real.name + ".lock")


PG_LOCK_CHECK_S = 10.0
"""Seconds between two checks that an engine still holds its PostgreSQL lock."""

_KEEPALIVE_SQL = (
    "SET tcp_keepalives_idle = 30; SET tcp_keepalives_interval = 10; SET tcp_keepalives_count = 3"
)
"""Server-side TCP keepalives of the lock's session (PostgreSQL docs, "Connection
Settings"): when the holder's machine vanishes without closing the connection (a node
lost), the server drops the session, and so the lock, within about a minute instead of the
system's default two hours, so that the replacing server can start. Ignored on a Unix
socket."""

_HELD_SQL = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
    "AND pid = pg_backend_pid() AND classid = 0 AND objid = :k AND objsubid = 1"
)


def _stop_this_process(reason: str) -> None:
    """What an engine does when its store's lock is lost: it may no longer write, so it
    stops (SIGTERM to itself: the server shuts down as on ``server stop``)."""
    import logging
    import signal

    logging.getLogger(__name__).critical("%s; stopping this server", reason)
    os.kill(os.getpid(), signal.SIGTERM)


class PgLock:
    """A PostgreSQL session advisory lock on a connection kept open, checked every
    ``check_interval_s`` by a daemon thread: the check keeps the connection from looking
    idle (to proxies and ``idle_session_timeout``), and when the session is gone (the
    database restarted, the connection cut), the lock is gone with it and
    ``on_lost(reason)`` is called once (default: this process stops, since another engine
    may take the store now)."""

    def __init__(
        self,
        connection: Any,
        *,
        check_interval_s: float = PG_LOCK_CHECK_S,
        on_lost: Any = _stop_this_process,
    ) -> None:  # noqa: ANN401
        self._connection = connection
        self._use = threading.Lock()  # one thread at a time on the connection
        self._released = threading.Event()
        self._thread = threading.Thread(
            target=self._watch,
            args=(check_interval_s, on_lost),
            name="trainyard-store-lock",
            daemon=True,
        )
        self._thread.start()

    def held(self) -> bool:
        """Whether this session still holds the lock (False once released or cut)."""
        from sqlalchemy import text

        with self._use:
            if self._released.is_set():
                return False
            try:
                count = self._connection.execute(text(_HELD_SQL), {"k": PG_LOCK_KEY}).scalar()
            except Exception:  # noqa: BLE001 - any failure of the session loses the lock
                return False
            return bool(count)

    def _watch(self, interval_s: float, on_lost: Any) -> None:  # noqa: ANN401
        while not self._released.wait(interval_s):
            if not self.held() and not self._released.is_set():
                on_lost("the store's PostgreSQL lock was lost (its connection ended)")
                return

    def release(self) -> None:
        """Drop the lock (idempotent): close its connection."""
        with self._use:
            self._released.set()
            with contextlib.suppress(Exception):
                self._connection.close()


_HOLDER_SQL = (
    "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :k "
    "AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database "
    "WHERE datname = current_database())"
)
"""Who holds the engine lock of this database (a bigint key below 2**32 shows as classid 0,
objid KEY, objsubid 1 in ``pg_locks``: PostgreSQL docs, "pg_locks")."""


def _pg_lock(url: str, **checks: Any) -> PgLock:
    """Take the engine's session advisory lock of the database at ``url`` on a connection of
    its own, kept open (and so the lock held) until ``release`` or this process's end;
    ``checks`` go to ``PgLock`` (``check_interval_s``, ``on_lost``).
    Advisory locks belong to one database: engines on two databases of one server never
    block each other."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.pool import NullPool

    name = f"trainyard-engine pid {os.getpid()} on {socket.gethostname()}"
    try:
        engine = create_engine(
            with_driver(url), poolclass=NullPool, connect_args={"application_name": name[:63]}
        )
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        conn.exec_driver_sql(_KEEPALIVE_SQL)
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": PG_LOCK_KEY}).scalar()
        if got:
            return PgLock(conn, **checks)
        who = conn.execute(text(_HOLDER_SQL), {"k": PG_LOCK_KEY}).scalar()
        conn.close()
    except ImportError as exc:
        raise StoreError(f"{NO_DRIVER}: {exc}") from exc
    except SQLAlchemyError as exc:
        raise StoreError(
            f"cannot take the engine lock of the store at {shown_url(url)}: {exc}"
        ) from exc
    raise EngineLockedError(
        f"the store at {shown_url(url)} is in use by another trainyard server "
        f"({who or 'unknown holder'}, PostgreSQL advisory lock {PG_LOCK_KEY}); only one "
        "engine may drive a store. Stop that server first"
    )


def acquire_store_lock(
    url: str, *, wait_s: float = 0.0, check_interval_s: float = PG_LOCK_CHECK_S, on_lost: Any = None
) -> HeldLock | None:  # noqa: ANN401
    """Take the one-engine lock of the store at ``url`` (before the engine touches it).
    A PostgreSQL lock is checked every ``check_interval_s``; once lost, ``on_lost(reason)``
    is called (default: this process stops with SIGTERM; see ``PgLock``).

    Returns:
        The held lock (keep it for the engine's life), or None for a store that needs none
        (in-memory SQLite).

    Raises:
        EngineLockedError: another engine holds it (the message names its pid).
        StoreError: the lock could not be asked for (PostgreSQL unreachable).
    """
    path = store_lock_path(url)
    if path is not None:
        db = path.with_name(path.name.removesuffix(".lock"))
        return FileLock.acquire(path, what=f"the store {db}", wait_s=wait_s)
    if make_url(url).drivername.startswith("sqlite"):
        return None
    if on_lost is None:
        return _pg_lock(url, check_interval_s=check_interval_s)
    return _pg_lock(url, check_interval_s=check_interval_s, on_lost=on_lost)
