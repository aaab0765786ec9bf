"""Task tokens: what a task's own ``trainyard``/``osmo`` CLI sends to the server.

A task never gets the admin's or the submitter's long-lived token. Every backend hands it,
in ``TRAINYARD_TOKEN``, a token bound to its workflow: ``tyt1.<workflow id>.<mac>`` where
``mac`` is HMAC-SHA256 of the workflow id under a key only the server's user can read
(``$TRAINYARD_HOME/task-token.key``, 32 random bytes, mode 0600, created once with an
exclusive create so the server and a backend never make two). The server accepts it as
the workflow's submitter, scoped to that one workflow (``trainyard.server.auth``), and
refuses it (401) once the workflow has ended: no list of tokens to keep or to expire.

Nothing else can be derived from it: the key never leaves the home, and a token names its
workflow in clear (it is no secret which workflow it belongs to, only the MAC is).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

__all__ = ["PREFIX", "task_token", "token_workflow", "rotate_key"]

PREFIX = "tyt1."
_KEY_FILE = "task-token.key"


def _key(home: Path) -> bytes:
    """The home's task-token key, created (0600, exclusive create) on first use."""
    path = home / _KEY_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    home.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_full(path)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    return path.read_bytes()


def rotate_key(home: Path) -> None:
    """Replace the home's task-token key with a new random one (atomically: a reader sees
    the old key or the new, whole), so that every task token made before is refused from
    now on. For a home whose store was replaced (``engine.homestore``): the old store's
    workflow ids may be given again, and its tasks' tokens must not name the new ones."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / _KEY_FILE
    fresh = path.with_name(f"{_KEY_FILE}.{os.getpid()}.new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(secrets.token_bytes(32))
    os.replace(fresh, path)


def _read_full(path: Path) -> bytes:
    """Another process created the key just now: wait until its 32 bytes are there."""
    for _ in range(1000):
        data = path.read_bytes()
        if len(data) >= 32:
            return data
        os.sched_yield()
    raise OSError(f"{path}: incomplete task-token key")


def _mac(home: Path, workflow_id: str) -> str:
    return hmac.new(_key(home), workflow_id.encode(), hashlib.sha256).hexdigest()


def task_token(home: Path, workflow_id: str) -> str:
    """The token of ``workflow_id``'s tasks (the same for every task and attempt)."""
    return f"{PREFIX}{workflow_id}.{_mac(home, workflow_id)}"


def token_workflow(home: Path, token: str) -> str | None:
    """The workflow id ``token`` is a valid task token of; None if it is not one (not a
    task token, or a forged or altered one). Compared in constant time."""
    if not token.startswith(PREFIX):
        return None
    workflow_id, _, mac = token[len(PREFIX) :].rpartition(".")
    if not workflow_id or not mac:
        return None
    if not (home / _KEY_FILE).exists():
        return None
    return workflow_id if hmac.compare_digest(mac, _mac(home, workflow_id)) else None
