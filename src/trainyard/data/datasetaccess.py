"""Who may do what with a dataset: ``<name>/owner.json`` holds ``{"owner", "readers"}``; the
owner and admins may add versions, tag, delete and share; readers (or ``EVERYONE``) may read.
A dataset without ``owner.json`` (made before ownership existed) is free for all; the first
uploader claims a new one with an exclusive create. Refusals are ``ForbiddenError`` (403)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from trainyard.data import storage
from trainyard.data.storage import Location
from trainyard.data.transfer import Mover
from trainyard.errors import DataError, ForbiddenError

__all__ = ["Actor", "DatasetAccess", "EVERYONE", "check_name", "read_if_there", "valid_name"]

EVERYONE = "*"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Actor:
    """Who the store acts for: a user name, and whether an admin (may do anything)."""

    name: str
    admin: bool = False


def valid_name(name: str) -> bool:
    """Whether ``name`` is a valid dataset name or tag (``check_name``'s rule)."""
    return _NAME.match(name) is not None


def check_name(name: str, what: str = "dataset name") -> str:
    """``name`` if valid: letters, digits, ``.``, ``_``, ``-``, at most 128, not starting
    with punctuation. Raises DataError naming the rule."""
    if not _NAME.match(name):
        raise DataError(
            f"bad {what} {name!r}: use letters, digits, '.', '_', '-' "
            "(at most 128, starting with a letter or digit)"
        )
    return name


def read_if_there(mover: Mover, loc: Location, what: str, path: str) -> bytes | None:
    """The bytes of ``path`` in the store ``loc``, None when it does not exist. Raises
    DataError (``what`` names the read in its message) for any other failure."""
    try:
        return mover.storage_call(what, lambda: storage.read_bytes(loc, path))
    except DataError as exc:
        if isinstance(exc.__cause__, FileNotFoundError):
            return None
        raise


class DatasetAccess:
    """The ownership of the datasets under one store root, checked for ``actor``.

    Args:
        loc: the store root.
        mover: makes the storage calls.
        actor: who acts (None: no checks, as the CLI without a server).
    """

    def __init__(self, loc: Location, mover: Mover, actor: Actor | None) -> None:
        self.loc = loc
        self.mover = mover
        self.actor = actor

    def owner(self, name: str) -> dict[str, Any] | None:
        """``{"owner", "readers"}`` of ``name``, None when it has no owner (made before
        ownership existed, or not created yet). Raises DataError."""
        raw = read_if_there(
            self.mover,
            self.loc,
            f"reading the owner of {name}",
            self.loc.join(check_name(name), "owner.json"),
        )
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return {
                "owner": str(data["owner"]),
                "readers": [str(r) for r in data.get("readers", [])],
            }
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{self.loc.show(f'{name}/owner.json')}: malformed: {exc}") from exc

    def _free_for(self, acl: dict[str, Any] | None) -> bool:
        actor = self.actor
        return actor is None or actor.admin or acl is None or acl["owner"] == actor.name

    def check_read(self, name: str) -> None:
        """Raise ForbiddenError unless the actor may read ``name``."""
        acl = self.owner(name)
        if self._free_for(acl):
            return
        assert acl is not None and self.actor is not None  # not free: both are set
        if EVERYONE in acl["readers"] or self.actor.name in acl["readers"]:
            return
        raise ForbiddenError(
            f"dataset {name} belongs to {acl['owner']} and is not shared with "
            f"{self.actor.name}; its owner can run `trainyard dataset share {name} "
            f"--user {self.actor.name}`"
        )

    def readable(self, name: str) -> bool:
        """Whether the actor may read ``name``."""
        try:
            self.check_read(name)
        except ForbiddenError:
            return False
        return True

    def check_write(self, name: str, action: str) -> None:
        """Raise ForbiddenError unless the actor may ``action`` (a verb phrase) ``name``."""
        acl = self.owner(name)
        if self._free_for(acl):
            return
        assert acl is not None
        raise ForbiddenError(
            f"dataset {name} belongs to {acl['owner']}; only they or an admin may {action} it"
        )

    def claim(self, name: str) -> None:
        """Make the actor the owner of a new dataset (exclusive create: the first creator
        wins; a second one is then checked like anyone else)."""
        if self.actor is None or self.owner(name) is not None:
            return
        self._write_owner(name, {"owner": self.actor.name, "readers": []}, exclusive=True)

    def _write_owner(self, name: str, acl: dict[str, Any], *, exclusive: bool = False) -> None:
        path = self.loc.join(name, "owner.json")
        data = json.dumps(acl).encode()
        if exclusive:
            self.mover.storage_call(
                f"claiming {name}", lambda: storage.create_exclusive(self.loc, path, data)
            )
        else:
            self.mover.storage_call(
                f"sharing {name}", lambda: storage.write_bytes(self.loc, path, data)
            )

    def share(self, name: str, user: str, *, remove: bool = False) -> dict[str, Any]:
        """Let ``user`` (or ``EVERYONE``) read ``name`` (an existing dataset), or stop that
        with ``remove``; one without an owner becomes the actor's. Returns the new
        ``owner.json``. Raises ForbiddenError: not the owner nor an admin."""
        self.check_write(name, "share")
        acl = self.owner(name) or {"owner": self.actor.name if self.actor else user, "readers": []}
        readers = [r for r in acl["readers"] if r != user]
        acl["readers"] = readers if remove else [*readers, user]
        self._write_owner(name, acl)
        return acl
