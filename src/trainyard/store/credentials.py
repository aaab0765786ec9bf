"""Credentials: a user's named secrets (OSMO's ``osmo credential``), encrypted at rest.

A task gets the credentials of its submitter that its spec names (``credentials:``), as
environment variables or files. Types and payload keys (OSMO docs, CLI reference "osmo
credential set"): REGISTRY (auth; registry, username optional), DATA (access_key_id,
access_key, endpoint; region default us-east-1, override_url, addressing_style optional),
GENERIC (any keys). Payloads are encrypted with the server's key (Fernet: AES-128-CBC and
HMAC-SHA256; ``credentials.key``, 0600), so a copy of the store reveals no secret. ``list``
returns only names, types and key names; values leave only through ``payloads`` (a launch).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from trainyard.errors import ConfigError, NotFoundError, StoreError

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

    from trainyard.store.db import Store

__all__ = [
    "CREDENTIAL_TYPES",
    "KEY_FILE",
    "CredentialRow",
    "CredentialVault",
    "check_payload",
    "not_found",
    "load_key",
]

CREDENTIAL_TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "REGISTRY": (("auth",), ("registry", "username")),
    "DATA": (
        ("access_key_id", "access_key", "endpoint"),
        ("region", "override_url", "addressing_style"),
    ),
    "GENERIC": ((), ()),
}
"""OSMO's credential types: (required keys, optional keys); GENERIC takes any keys."""

KEY_FILE = "credentials.key"
"""The server's Fernet key, in the home, mode 0600."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
MAX_PAYLOAD_BYTES = 1 << 20
"""The largest payload accepted (all values together), 1 MiB."""


def not_found(name: str) -> NotFoundError:
    """OSMO's error for a credential the user lacks: ``Could not find the credential: NAME``."""
    return NotFoundError(f"Could not find the credential: {name}")


def check_payload(name: str, kind: str, payload: dict[str, str]) -> None:
    """Check a credential before it is stored.

    Raises:
        ConfigError: a bad name, type, key or value; names the part and lists the choices.
    """
    if not _NAME.match(name):
        raise ConfigError(
            f"credential name {name!r}: use letters, digits, '_', '.', '-' "
            "(starting with a letter or digit, at most 200)"
        )
    if kind not in CREDENTIAL_TYPES:
        raise ConfigError(f"credential type {kind!r}: one of {', '.join(CREDENTIAL_TYPES)}")
    if not payload:
        raise ConfigError(
            "credential payload: give at least one KEY=VALUE (--payload or --payload-file)"
        )
    for key in payload:
        if not _KEY.match(key) or key in (".", ".."):  # a key is also a file name
            raise ConfigError(
                f"credential payload key {key!r}: use letters, digits, '_', "
                "'.', '-' (not '.' or '..')"
            )
    required, optional = CREDENTIAL_TYPES[kind]
    missing = [k for k in required if not payload.get(k)]
    if missing:
        raise ConfigError(
            f"a {kind} credential needs payload key(s) {', '.join(missing)} "
            f"(required: {', '.join(required)}; optional: {', '.join(optional)})"
        )
    unknown = sorted(set(payload) - set(required) - set(optional)) if required else []
    if unknown:
        raise ConfigError(
            f"a {kind} credential takes no payload key(s) {', '.join(unknown)} "
            f"(required: {', '.join(required)}; optional: {', '.join(optional)})"
        )
    if sum(len(k) + len(v) for k, v in payload.items()) > MAX_PAYLOAD_BYTES:
        raise ConfigError(f"credential payload: more than {MAX_PAYLOAD_BYTES} bytes")


def load_key(home: Path) -> bytes:
    """The server's Fernet key from ``home/credentials.key``, made (0600, never replaced) on
    first use. Two servers racing make one key: the file is created exclusively.

    Raises:
        StoreError: the key file cannot be read or made, or is not a Fernet key.
    """
    from cryptography.fernet import Fernet

    path = home / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    except OSError as exc:
        raise StoreError(f"cannot make the credentials key {path}: {exc.strerror}") from exc
    else:
        with os.fdopen(fd, "wb") as out:
            out.write(Fernet.generate_key())
    try:
        key = path.read_bytes().strip()
        Fernet(key)
    except (OSError, ValueError) as exc:
        raise StoreError(
            f"the credentials key {path} cannot be used ({exc}); restore it "
            "from a backup (without it the stored credentials cannot be read)"
        ) from exc
    return key


class CredentialRow(TypedDict):
    """One credential of a user, without its values (``CredentialVault.list_for_user``)."""

    name: str
    type: str
    keys: list[str]
    create_time_s: float  #: Unix seconds


class CredentialVault:
    """Users' credentials in the store, encrypted with the home's key.

    Args:
        store: the store (its ``credentials`` table).
        home: the server's home (the key file).
    """

    def __init__(self, store: Store, home: Path) -> None:
        self.store = store
        self.home = home
        self._fernet: Fernet | None = None

    def _box(self) -> Fernet:
        if self._fernet is None:
            from cryptography.fernet import Fernet

            self._fernet = Fernet(load_key(self.home))
        return self._fernet

    def set(self, user: str, name: str, kind: str, payload: dict[str, str]) -> dict[str, object]:
        """Create or replace ``user``'s credential ``name`` (OSMO: "create or update").

        Returns:
            ``{"name", "type", "keys"}`` (the key names, never the values).

        Raises:
            ConfigError: as ``check_payload``.
        """
        check_payload(name, kind, payload)
        if kind == "DATA":
            payload = {"region": "us-east-1", **payload}
        token = self._box().encrypt(json.dumps(payload).encode()).decode()
        self.store.put_credential(user, name, kind, token)
        return {"name": name, "type": kind, "keys": sorted(payload)}

    def list_for_user(self, user: str) -> list[CredentialRow]:
        """``user``'s credentials, by name. Key names come from the decrypted payload; no
        value is returned."""
        rows: list[CredentialRow] = []
        for name, kind, token, created in self.store.credential_rows(user):
            rows.append(
                {
                    "name": name,
                    "type": kind,
                    "keys": sorted(self._open(name, token)),
                    "create_time_s": created,
                }
            )
        return rows

    def delete(self, user: str, name: str) -> None:
        """Delete ``user``'s credential ``name``. Raises NotFoundError (OSMO's words)."""
        if not self.store.delete_credential(user, name):
            raise not_found(name)

    def check_names(self, user: str, names: list[str]) -> None:
        """Raise NotFoundError (``Could not find the credential: NAME``, the first missing in
        ``names`` order) unless ``user`` has every credential of ``names``."""
        have = {row[0] for row in self.store.credential_rows(user)}
        for name in names:
            if name not in have:
                raise not_found(name)

    def payloads(self, user: str, names: list[str]) -> dict[str, tuple[str, dict[str, str]]]:
        """``{name: (type, payload)}`` of those of ``names`` that ``user`` has, decrypted:
        for a task's launch only, never for an answer of the API."""
        wanted = set(names)
        return {
            name: (kind, self._open(name, token))
            for name, kind, token, _created in self.store.credential_rows(user)
            if name in wanted
        }

    def data_payloads(self, user: str) -> list[dict[str, str]]:
        """``user``'s DATA credentials' payloads, decrypted, longest ``endpoint`` first (the
        most specific wins): for the url inputs and outputs of their tasks (OSMO: "Data"
        credentials are used for the storage their endpoint names)."""
        found = [
            self._open(name, token)
            for name, kind, token, _created in self.store.credential_rows(user)
            if kind == "DATA"
        ]
        return sorted(found, key=lambda p: len(p.get("endpoint", "")), reverse=True)

    def registry_payloads(self, user: str) -> list[dict[str, str]]:
        """``user``'s REGISTRY credentials' payloads, decrypted, each with its ``registry``
        (default ``docker.io``, Docker Hub, as OSMO's): for pulling their tasks' images
        from that registry (OSMO docs, "Credentials": registry credentials are used to pull
        the images of the workflows of their owner). Never for an answer of the API."""
        return [
            {"registry": "docker.io", **self._open(name, token)}
            for name, kind, token, _created in self.store.credential_rows(user)
            if kind == "REGISTRY"
        ]

    def _open(self, name: str, token: str) -> dict[str, str]:
        from cryptography.fernet import InvalidToken

        try:
            return dict(json.loads(self._box().decrypt(token.encode())))
        except InvalidToken as exc:
            raise StoreError(
                f"credential {name!r} cannot be decrypted with "
                f"{self.home / KEY_FILE} (the key was replaced?); set it again"
            ) from exc
