"""Each user's credentials (``CredentialVault``) for the API: stored, listed, deleted by
their owner; a value is never answered."""

from __future__ import annotations

from typing import cast

from trainyard.engine.reconciler import Engine
from trainyard.server.answers import CredentialAnswer, DeletedAnswer
from trainyard.server.auth import User, refuse_task_token
from trainyard.server.shapes import iso


class UserCredentials:
    """The credentials of one engine's vault, on their owner's behalf."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def save(self, user: User, name: str, kind: str, payload: dict[str, str]) -> CredentialAnswer:
        """Create or replace the caller's credential (``CredentialVault.set``); a task token
        may not. Returns ``{"name", "type", "keys"}``, never a value."""
        refuse_task_token(user, "set a credential")
        return cast(CredentialAnswer, self.engine.credentials.set(user.name, name, kind, payload))

    def list_for(self, user: User) -> list[CredentialAnswer]:
        """The caller's credentials: ``[{"name", "type", "keys", "create_time"}]``."""
        rows = self.engine.credentials.list_for_user(user.name)
        return [
            {
                "name": r["name"],
                "type": r["type"],
                "keys": r["keys"],
                "create_time": iso(float(r["create_time_s"])),
            }
            for r in rows
        ]

    def delete(self, user: User, name: str) -> DeletedAnswer:
        """Delete the caller's credential; a task token may not. Raises NotFoundError."""
        refuse_task_token(user, "delete a credential")
        self.engine.credentials.delete(user.name, name)
        return {"name": name, "deleted": True}
