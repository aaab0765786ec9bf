"""Tokens and users of the server.

``$TRAINYARD_HOME/tokens.json`` (mode 0600) maps token to ``{"user": ..., "admin": bool}``;
at first start it holds one admin token for the user who started the server, also written to
``$TRAINYARD_HOME/token`` (0600) for the CLI. ``trainyard server add-user USER`` adds one;
a running server reads the file again when it changed. Tokens are compared in constant time.
Writes are serialized across processes (``flock`` on ``tokens.lock``), re-read under the lock
and replaced atomically, so concurrent ``add-user`` runs all keep their tokens. A task token
(``trainyard.tasktokens``) acts as the submitter of its one workflow (``User.workflow``),
never as an admin, and only until that workflow ends (401 after).
"""

from __future__ import annotations

import fcntl
import getpass
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from trainyard import tasktokens
from trainyard.errors import AuthError, ForbiddenError, NotFoundError, RefusedError

__all__ = [
    "User",
    "TokenInfo",
    "TokenRegistry",
    "read_client_token",
    "read_login",
    "write_login",
    "LOGIN_FILE",
    "refuse_task_token",
]


@dataclass(frozen=True)
class TokenInfo:
    """What ``tokens.json`` keeps beside a token's user: OSMO's access-token fields (``token
    set NAME -d DESC -e YYYY-MM-DD``). Tokens made before names existed have none."""

    name: str | None = None
    description: str = ""
    expires_at: str | None = None
    """The last day the token works (``YYYY-MM-DD``, UTC), or None: it does not expire."""


@dataclass(frozen=True)
class User:
    """Who is calling: a name and whether they may act on every workflow.

    ``workflow`` is set for a task token: the caller is a task of that workflow, acting as
    its submitter on that workflow only (read it, its logs); nothing else.
    """

    name: str
    admin: bool = False
    workflow: str | None = None


def refuse_task_token(user: User, action: str) -> None:
    """Raise ForbiddenError (403) when ``user`` holds a task token: ``action`` (``submit a
    workflow``, ``cancel a workflow``, ...) needs the user's own token."""
    if user.workflow is not None:
        raise ForbiddenError(
            f"a task token (of workflow {user.workflow}) may not {action}; "
            "it only reads its own workflow"
        )


WorkflowOwner = Callable[[str], str]
"""Given a workflow id, its submitter; raises AuthError if the workflow ended or is unknown."""


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by its owner (created 0600, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


class TokenRegistry:
    """The server's tokens, stored in ``home/tokens.json``."""

    def __init__(self, home: Path, workflow_owner: WorkflowOwner | None = None) -> None:
        self.home = home
        self.path = home / "tokens.json"
        self.workflow_owner = workflow_owner
        self._tokens: dict[str, User] = {}
        self._info: dict[str, TokenInfo] = {}
        self._stamp: tuple[int, int, int] | None = None
        with self._locked():
            self._load_or_create()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the exclusive lock that serializes writers of ``tokens.json``."""
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.home / "tokens.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _load_or_create(self) -> None:
        if self.path.exists():
            self._load()
            return
        token = self._add_locked(getpass.getuser(), admin=True)
        _write_private(self.home / "token", token + "\n")

    def _load(self) -> None:
        stamp = self._file_stamp()
        data = json.loads(self.path.read_text())
        self._tokens = {t: User(u["user"], bool(u.get("admin"))) for t, u in data.items()}
        self._info = {
            t: TokenInfo(u.get("name"), u.get("description") or "", u.get("expires_at"))
            for t, u in data.items()
        }
        self._stamp = stamp

    def _reload_if_changed(self) -> None:
        """Read the file again when another process (``server add-user``) replaced it."""
        if self._file_stamp() not in (None, self._stamp):
            self._load()

    def _save(self) -> None:
        data = {
            t: {"user": u.name, "admin": u.admin, **self._info_json(t)}
            for t, u in self._tokens.items()
        }
        _write_private(self.path, json.dumps(data, indent=1))
        self._stamp = self._file_stamp()

    def _info_json(self, token: str) -> dict[str, str]:
        info = self._info.get(token, TokenInfo())
        out = {
            "name": info.name,
            "description": info.description or None,
            "expires_at": info.expires_at,
        }
        return {k: v for k, v in out.items() if v}

    def add(self, user: str, *, admin: bool = False, info: TokenInfo | None = None) -> str:
        """Create a token for ``user`` and return it. Safe against concurrent writers.

        Raises:
            RefusedError: ``info`` names a token ``user`` already has.
        """
        with self._locked():
            return self._add_locked(user, admin=admin, info=info)

    def _add_locked(self, user: str, *, admin: bool, info: TokenInfo | None = None) -> str:
        if self.path.exists():
            self._load()  # always: a stamp can miss a replace within one clock tick
        if info is not None and info.name and self._named(user, info.name):
            raise RefusedError(
                f"{user} has a token named {info.name!r} already; delete it "
                "first or pick another name"
            )
        token = secrets.token_urlsafe(32)
        self._tokens[token] = User(user, admin)
        if info is not None:
            self._info[token] = info
        self._save()
        return token

    def _named(self, user: str, name: str) -> list[str]:
        return [
            t
            for t, u in self._tokens.items()
            if u.name == user and self._info.get(t, TokenInfo()).name == name
        ]

    def tokens(self, user: str | None = None) -> list[dict[str, object]]:
        """OSMO's ``token list``: each token's user, name, description, expiry and whether
        it is an admin's (of ``user`` only when given); never the token itself."""
        self._reload_if_changed()
        rows: list[dict[str, object]] = []
        for token, owner in self._tokens.items():
            if user is None or owner.name == user:
                info = self._info.get(token, TokenInfo())
                rows.append(
                    {
                        "user": owner.name,
                        "name": info.name,
                        "admin": owner.admin,
                        "description": info.description,
                        "expires_at": info.expires_at,
                    }
                )
        return sorted(rows, key=lambda r: (str(r["user"]), str(r["name"] or "")))

    def delete(self, user: str, name: str) -> None:
        """Delete ``user``'s token called ``name``. Raises NotFoundError."""
        with self._locked():
            self._load()
            named = self._named(user, name)
            if not named:
                raise NotFoundError(f"{user} has no token named {name!r}")
            for token in named:
                del self._tokens[token]
                self._info.pop(token, None)
            self._save()

    def set_admin(self, user: str, admin: bool) -> None:
        """Make every token of ``user`` an admin's, or an ordinary user's. Raises
        NotFoundError for a user without tokens."""
        with self._locked():
            self._load()
            mine = [t for t, u in self._tokens.items() if u.name == user]
            if not mine:
                raise NotFoundError(f"no user {user}; `user list` shows them")
            for token in mine:
                self._tokens[token] = User(user, admin)
            self._save()

    def remove_user(self, user: str) -> int:
        """Delete every token of ``user`` (they can no longer call the server); how many.
        Raises NotFoundError for a user without tokens."""
        with self._locked():
            self._load()
            mine = [t for t, u in self._tokens.items() if u.name == user]
            if not mine:
                raise NotFoundError(f"no user {user}; `user list` shows them")
            for token in mine:
                del self._tokens[token]
                self._info.pop(token, None)
            self._save()
            return len(mine)

    def users(self) -> list[dict[str, object]]:
        """Every user that holds a token, with OSMO's roles (``osmo-admin`` for an admin,
        ``osmo-user`` for everyone), by name."""
        self._reload_if_changed()
        admins: dict[str, bool] = {}
        for owner in self._tokens.values():
            admins[owner.name] = admins.get(owner.name, False) or owner.admin
        return [
            {"id": name, "roles": ["osmo-admin", "osmo-user"] if admin else ["osmo-user"]}
            for name, admin in sorted(admins.items())
        ]

    def authenticate(self, token: str | None) -> User:
        """The user of ``token``. Raises AuthError (401) when it is missing or unknown."""
        if not token:
            raise AuthError("no token given: send `Authorization: Bearer TOKEN`")
        if token.startswith(tasktokens.PREFIX):
            return self._task_user(token)
        self._reload_if_changed()
        for known, user in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                _check_expiry(self._info.get(known, TokenInfo()))
                return user
        raise AuthError("unknown token")

    def _task_user(self, token: str) -> User:
        workflow_id = tasktokens.token_workflow(self.home, token)
        if workflow_id is None or self.workflow_owner is None:
            raise AuthError("unknown token")
        return User(self.workflow_owner(workflow_id), admin=False, workflow=workflow_id)


def _check_expiry(info: TokenInfo) -> None:
    """Raise AuthError when the token's last day (UTC) is past."""
    if info.expires_at is None:
        return
    from datetime import datetime

    if datetime.now(UTC).date().isoformat() > info.expires_at:
        raise AuthError(f"token {info.name or ''} expired on {info.expires_at}".replace("  ", " "))


LOGIN_FILE = "login.json"
"""Where ``login URL --token T`` keeps the server and token (``home/login.json``, 0600)."""


def read_login(home: Path) -> dict[str, str] | None:
    """``{"url", "token"}`` saved by ``login``, else None (no file, or unreadable)."""
    try:
        data = json.loads((home / LOGIN_FILE).read_text())
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(data, dict)
        and isinstance(data.get("url"), str)
        and isinstance(data.get("token"), str)
    )
    return data if ok else None


def write_login(home: Path, url: str, token: str) -> None:
    """Save the server and token of ``login`` (0600)."""
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    _write_private(home / LOGIN_FILE, json.dumps({"url": url, "token": token}))


def read_client_token(home: Path) -> str | None:
    """The token the CLI sends: ``$TRAINYARD_TOKEN``, else the ``login``'s, else
    ``home/token``, else None."""
    env = os.environ.get("TRAINYARD_TOKEN")
    if env:
        return env.strip()
    login = read_login(home)
    if login is not None:
        return login["token"]
    path = home / "token"
    return path.read_text().strip() if path.exists() else None
