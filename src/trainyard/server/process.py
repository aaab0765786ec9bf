"""Starting, finding and stopping the local server process.

One server per ``$TRAINYARD_HOME``, one engine per store: the server holds an exclusive lock
on ``$TRAINYARD_HOME/server.lock`` (and ``store.lock``) for its whole life; the OS drops it when
the server dies. The lock's note is ``{"pid", "host", "url", "create_time_s"}``;
``server.json`` (``{"pid", "url", "create_time_s"}``) appears once it listens. ``ensure_running``
uses the holder's address, else starts exactly one server (``server.start.lock``); a second
``python -m trainyard.server`` exits 4 (``EngineLockedError``). A server that fails to start
writes ``server.failed`` (``{"pid", "kind", "message"}``) and the CLI raises that error.
``claimed_url`` trusts the note without psutil; a failed connect falls back to
``ensure_running``. Details: docs/architecture.md, "The server process".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trainyard import errors
from trainyard.errors import ServerError, TrainyardError
from trainyard.store.lock import FileLock, flock_within, holder

__all__ = [
    "ServerInfo",
    "read_info",
    "is_alive",
    "start_background",
    "start",
    "stop",
    "ensure_running",
    "find_running",
    "claimed_url",
    "lock_path",
    "take_home_lock",
    "record_failure",
]

START_TIMEOUT_S = 30.0
"""How long the CLI waits for a server it started (or that is starting) to listen."""

HEALTH_TIMEOUT_S = 5.0
"""One ``/api/health`` try while a started server comes up (only then is health asked)."""


@dataclass(frozen=True)
class ServerInfo:
    """Where a running server listens."""

    pid: int
    url: str
    create_time_s: float


def info_path(home: Path) -> Path:
    return home / "server.json"


def lock_path(home: Path) -> Path:
    """The one-server-per-home lock file."""
    return home / "server.lock"


def _failed_path(home: Path) -> Path:
    return home / "server.failed"


def take_home_lock(home: Path, *, wait_s: float = 2.0) -> FileLock:
    """Take ``home``'s server lock for this process's life.

    Raises:
        EngineLockedError: another server holds it (its pid named).
    """
    return FileLock.acquire(lock_path(home), what=f"the trainyard home {home}", wait_s=wait_s)


def write_info(home: Path, url: str, lock: FileLock | None = None) -> None:
    """Record this process as the server (called by the server once it listens): in the
    lock's note when given, and in ``server.json``."""
    import psutil

    pid = os.getpid()
    data = {"pid": pid, "url": url, "create_time_s": psutil.Process(pid).create_time()}
    if lock is not None:
        lock.note({**data, "host": os.uname().nodename})
    tmp = info_path(home).with_name(f".server.json.{pid}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, info_path(home))


def record_failure(home: Path, exc: TrainyardError) -> None:
    """Say why this server did not start, for the CLI that started it."""
    data = {"pid": os.getpid(), "kind": type(exc).__name__, "message": str(exc)}
    tmp = _failed_path(home).with_name(f".server.failed.{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, _failed_path(home))


def _failure_of(home: Path, pid: int) -> TrainyardError | None:
    """The error the server ``pid`` recorded when it gave up starting, if it did."""
    try:
        data = json.loads(_failed_path(home).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("pid") != pid:
        return None
    cls = getattr(errors, str(data.get("kind")), None)
    if not (isinstance(cls, type) and issubclass(cls, TrainyardError)) or cls is errors.SpecError:
        cls = ServerError
    return cls(str(data.get("message")))


def read_info(home: Path) -> ServerInfo | None:
    """The server ``server.json`` records, or None (it may be stale: ``find_running`` is
    the truth)."""
    path = info_path(home)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        return ServerInfo(int(data["pid"]), str(data["url"]), float(data["create_time_s"]))
    except (ValueError, KeyError, TypeError):
        return None


def is_alive(info: ServerInfo, timeout_s: float = 2.0) -> bool:
    """True when the recorded process still runs (same pid AND same start time) and answers."""
    import psutil

    try:
        proc = psutil.Process(info.pid)
        if abs(proc.create_time() - info.create_time_s) > 1.0:
            return False
    except psutil.Error:
        return False
    try:
        # plain http to our own server: no TLS, so no CA bundle to load
        verify = not info.url.lower().startswith("http://")
        return (
            httpx.get(f"{info.url}/api/health", timeout=timeout_s, verify=verify).status_code == 200
        )
    except httpx.HTTPError:
        return False


def _info_of(note: dict[str, Any]) -> ServerInfo | None:
    """The address in a held lock's note; None while the holder has not written it yet
    (the note may for an instant still be its dead predecessor's: same pid and start time
    are required)."""
    import psutil

    try:
        info = ServerInfo(int(note["pid"]), str(note["url"]), float(note["create_time_s"]))
    except (KeyError, ValueError, TypeError):
        return None
    try:
        if abs(psutil.Process(info.pid).create_time() - info.create_time_s) > 1.0:
            return None
    except psutil.Error:
        return None
    return info


def find_running(home: Path, *, wait_s: float = START_TIMEOUT_S) -> ServerInfo | None:
    """The server holding ``home``'s lock, never asking it anything (a busy server is still
    the server); None when no server holds the lock.

    A holder that is still starting (it has not written its address yet) is waited for up
    to ``wait_s``.

    Raises:
        ServerError: a server holds the lock but gave no address within ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        note = holder(lock_path(home))
        if note is None:
            return None
        info = _info_of(note)
        if info is not None:
            return info
        if time.monotonic() >= deadline:
            raise ServerError(
                f"a trainyard server (pid {note.get('pid', '?')}) holds {lock_path(home)} but "
                f"did not say where it listens within {wait_s:.0f} s; see "
                f"{home / 'server.log'}, or stop it with `trainyard server stop`"
            )
        time.sleep(0.1)


def claimed_url(home: Path) -> str | None:
    """The address in the note of the server holding ``home``'s lock, checked only as far
    as is cheap: the lock is held, the note names a URL, was written on this host, and its
    pid is alive (``os.kill(pid, 0)``); None otherwise (no holder, one still starting, a
    dead pid: ``ensure_running`` then decides, as before). Never blocks, never raises.

    Unlike ``find_running`` it does not check that the pid is still the process that wrote
    the note (psutil's start time: an import the CLI's start avoids). A note can be left
    by a dead server only for the instant between its successor taking the lock and
    rewriting the note; its pid would then have to be alive again as another process. A
    URL from here is for a first request that falls back to ``ensure_running`` when it
    cannot connect (``cli.client.Client``).
    """
    try:
        note = holder(lock_path(home))
    except OSError:
        return None
    if not note or note.get("host") != os.uname().nodename:
        return None
    pid, url = note.get("pid"), note.get("url")
    if not isinstance(pid, int) or pid <= 0 or not isinstance(url, str) or not url:
        return None
    try:
        os.kill(pid, 0)
    except OSError:  # gone (ProcessLookupError), or not ours (PermissionError): check fully
        return None
    return url


@contextlib.contextmanager
def _starting(home: Path, timeout_s: float = 3 * START_TIMEOUT_S) -> Iterator[None]:
    """One CLI at a time decides whether to start a server (``server.start.lock``)."""
    fd = os.open(home / "server.start.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not flock_within(fd, timeout_s):
            raise ServerError(
                f"another trainyard command has been starting the server "
                f"for {timeout_s:.0f} s; see {home / 'server.log'}"
            )
        yield
    finally:
        os.close(fd)


def _wait_started(home: Path, proc: subprocess.Popen[bytes]) -> ServerInfo:
    log_path = home / "server.log"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        note = holder(lock_path(home))
        info = _info_of(note) if note else None
        if info is not None and info.pid == proc.pid and is_alive(info, HEALTH_TIMEOUT_S):
            return info
        if proc.poll() is not None:
            failure = _failure_of(home, proc.pid)
            if isinstance(failure, errors.EngineLockedError):
                found = find_running(home)  # started by hand meanwhile: use it
                if found is not None:
                    return found
            if failure is not None:
                raise failure
            break
        time.sleep(0.1)
    raise ServerError(f"the trainyard server did not start; see {log_path}")


def start_background(home: Path, host: str = "127.0.0.1", port: int = 0) -> ServerInfo:
    """Start ``python -m trainyard.server`` detached, wait until it answers, return it.
    Callers make sure none holds the lock first (``ensure_running``, ``start``).

    Raises:
        ServerError: it did not come up within START_TIMEOUT_S; the message points at its log.
        TrainyardError: the error the server gave up with (a damaged store: StoreError).
    """
    log_path = home / "server.log"
    with log_path.open("ab") as log:
        os.chmod(log_path, 0o600)  # the owner's only, like the rest of the home
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainyard.server", "--host", host, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "TRAINYARD_HOME": str(home)},
        )
    try:
        return _wait_started(home, proc)
    finally:
        if proc.poll() is not None:
            proc.wait()


def start(home: Path, host: str = "127.0.0.1", port: int = 0) -> tuple[ServerInfo, bool]:
    """The server of ``home``: the one holding the lock, else one started now (one CLI at a
    time decides). Returns ``(info, started_now)``."""
    info = find_running(home)
    if info is not None:
        return info, False
    with _starting(home):
        info = find_running(home)
        if info is not None:
            return info, False
        return start_background(home, host=host, port=port), True


def stop(home: Path, timeout_s: float = 15.0) -> bool:
    """Stop the server holding ``home``'s lock (SIGTERM, then SIGKILL after ``timeout_s``),
    whatever ``server.json`` says. Returns False if none ran.

    Raises:
        ServerError: the holder runs on another host (a home shared over the network).
    """
    note = holder(lock_path(home))
    deadline = time.monotonic() + 5.0
    while note is not None and "pid" not in note and time.monotonic() < deadline:
        time.sleep(0.05)  # it has just taken the lock; its pid follows at once
        note = holder(lock_path(home))
    if note is None or "pid" not in note:
        info_path(home).unlink(missing_ok=True)
        return False
    if note.get("host", os.uname().nodename) != os.uname().nodename:
        raise ServerError(
            f"the trainyard server of {home} runs on {note['host']} (pid "
            f"{note['pid']}); stop it there"
        )
    import psutil

    pid = int(note["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        psutil.Process(pid).wait(timeout=timeout_s)
    except psutil.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=timeout_s)
    except psutil.NoSuchProcess:
        pass
    info_path(home).unlink(missing_ok=True)
    return True


def ensure_running(home: Path) -> ServerInfo:
    """The server to talk to: ``$TRAINYARD_SERVER_URL``, else the one holding the lock,
    else one started now in the background."""
    if os.environ.get("TRAINYARD_SERVER_URL"):
        url = os.environ["TRAINYARD_SERVER_URL"].rstrip("/")
        return ServerInfo(pid=0, url=url, create_time_s=0.0)
    return start(home)[0]
