"""Tokens and users of the server.

At first start the server creates ``$TRAINYARD_HOME/tokens.json`` (mode 0600): a map from
token to ``{"user": ..., "admin": bool}`` holding one admin token for the user who started it,
also written alone to ``$TRAINYARD_HOME/token`` (mode 0600) where the CLI finds it. An admin
adds users with ``trainyard server add-user USER``, which writes the file; a running server
reads it again when it changed, so new tokens work at once. Tokens are compared in constant
time.
"""

from __future__ import annotations

import getpass
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from trainyard.errors import AuthError

__all__ = ["User", "TokenRegistry", "read_client_token"]


@dataclass(frozen=True)
class User:
    """Who is calling: a name and whether they may act on every workflow."""

    name: str
    admin: bool = False


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable only by its owner (created 0600, then renamed)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


class TokenRegistry:
    """The server's tokens, stored in ``home/tokens.json``."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.path = home / "tokens.json"
        self._tokens: dict[str, User] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._load_or_create()

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
        token = self.add(getpass.getuser(), admin=True)
        _write_private(self.home / "token", token + "\n")

    def _load(self) -> None:
        stamp = self._file_stamp()
        data = json.loads(self.path.read_text())
        self._tokens = {t: User(u["user"], bool(u.get("admin"))) for t, u in data.items()}
        self._stamp = stamp

    def _reload_if_changed(self) -> None:
        """Read the file again when another process (``server add-user``) replaced it."""
        if self._file_stamp() not in (None, self._stamp):
            self._load()

    def _save(self) -> None:
        data = {t: {"user": u.name, "admin": u.admin} for t, u in self._tokens.items()}
        _write_private(self.path, json.dumps(data, indent=1))
        self._stamp = self._file_stamp()

    def add(self, user: str, *, admin: bool = False) -> str:
        """Create a token for ``user`` and return it."""
        self._reload_if_changed()
        token = secrets.token_urlsafe(32)
        self._tokens[token] = User(user, admin)
        self._save()
        return token

    def authenticate(self, token: str | None) -> User:
        """The user of ``token``. Raises AuthError (401) when it is missing or unknown."""
        if not token:
            raise AuthError("no token given: send `Authorization: Bearer TOKEN`")
        self._reload_if_changed()
        for known, user in self._tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return user
        raise AuthError("unknown token")


def read_client_token(home: Path) -> str | None:
    """The token the CLI sends: ``$TRAINYARD_TOKEN``, else ``home/token``, else None."""
    env = os.environ.get("TRAINYARD_TOKEN")
    if env:
        return env.strip()
    path = home / "token"
    return path.read_text().strip() if path.exists() else None
