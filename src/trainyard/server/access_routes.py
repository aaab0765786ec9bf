"""OSMO's ``token`` and ``user`` commands over the server's token registry (``auth``).

A user manages their own named tokens (``token set|list|delete``); an admin also those of
another user (``-u USER``) and makes users (``user create``: a user is whoever holds a
token, so creating one gives them a first token, named ``default``). Tokens are shown once,
when made; ``token list`` never shows them. OSMO's roles map onto trainyard's two kinds of
user: ``osmo-admin`` (or ``admin``) makes an admin, any other role an ordinary user.
"""

from __future__ import annotations

import re
from typing import Annotated, cast

from fastapi import Depends, FastAPI, Query, Request
from pydantic import BaseModel, Field

from trainyard.errors import BadArgumentError, ForbiddenError, NotFoundError, RefusedError
from trainyard.server.answers import (
    NewTokenAnswer,
    NewUserAnswer,
    TokenAnswer,
    TokenDeletedAnswer,
    TokenRolesAnswer,
    UserAnswer,
    UserDeletedAnswer,
    UserInfoAnswer,
)
from trainyard.server.auth import TokenInfo, TokenRegistry, User, refuse_task_token
from trainyard.server.scopes import check_task_scope

__all__ = ["add_access_routes", "ADMIN_ROLES"]

ADMIN_ROLES = frozenset({"osmo-admin", "admin"})
"""OSMO roles that make an admin here."""

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class TokenRequest(BaseModel):
    """OSMO's ``token set NAME -e DATE -d DESC -u USER -r ROLE...``."""

    name: str = Field(min_length=1, max_length=100)
    expires_at: str | None = None
    description: str = ""
    user: str | None = None
    roles: list[str] = []


class UserRequest(BaseModel):
    """OSMO's ``user create USER_ID -r ROLE...``."""

    user: str = Field(min_length=1, max_length=200)
    roles: list[str] = []


def _caller(request: Request) -> User:
    """The caller, from ``Authorization: Bearer TOKEN`` (as ``app.current_user``).
    Raises AuthError (401), ForbiddenError (403: a task token, ``scopes``)."""
    header = request.headers.get("authorization") or ""
    token = header[7:].strip() if header.lower().startswith("bearer ") else None
    user: User = request.app.state.tokens.authenticate(token)
    check_task_scope(user, request)
    return user


Caller = Annotated[User, Depends(_caller)]


def _for_user(caller: User, user: str | None, action: str) -> str:
    """Whose tokens a request acts on: ``user`` (an admin only, unless it is the caller)
    or the caller."""
    refuse_task_token(caller, action)
    if user is None or user == caller.name:
        return caller.name
    if not caller.admin:
        raise ForbiddenError(f"only an admin may {action} of {user}; you are {caller.name}")
    return user


def _admin_role(caller: User, roles: list[str]) -> bool:
    admin = bool(ADMIN_ROLES & set(roles))
    if admin and not caller.admin:
        raise ForbiddenError("only an admin may give the osmo-admin role")
    return admin


def _check_date(value: str | None) -> str | None:
    if value is not None and not _DATE.match(value):
        raise BadArgumentError(f"expires at {value!r}: give a date as YYYY-MM-DD")
    return value


def add_access_routes(app: FastAPI, tokens: TokenRegistry) -> None:
    """``/api/token`` (GET list, POST set, DELETE /{name}) and ``/api/user`` (GET, POST)."""

    @app.get("/api/token", response_model=None)
    def list_tokens(u: Caller, user: str | None = None) -> list[TokenAnswer]:
        return cast(list[TokenAnswer], tokens.tokens(_for_user(u, user, "list the tokens")))

    @app.post("/api/token", response_model=None)
    def set_token(req: TokenRequest, u: Caller) -> NewTokenAnswer:
        owner = _for_user(u, req.user, "make the tokens")
        info = TokenInfo(req.name, req.description, _check_date(req.expires_at))
        token = tokens.add(
            owner, admin=_admin_role(u, req.roles) or (owner == u.name and u.admin), info=info
        )
        return {
            "user": owner,
            "name": req.name,
            "token": token,
            "expires_at": info.expires_at,
            "description": info.description,
        }

    @app.delete("/api/token/{name}", response_model=None)
    def delete_token(name: str, u: Caller, user: str | None = None) -> TokenDeletedAnswer:
        owner = _for_user(u, user, "delete the tokens")
        tokens.delete(owner, name)
        return {"user": owner, "name": name, "deleted": True}

    add_user_admin_routes(app, tokens)

    @app.get("/api/user", response_model=None)
    def list_users(
        u: Caller,
        id_prefix: str | None = None,
        role: Annotated[list[str] | None, Query()] = None,
        count: int = 100,
    ) -> list[UserAnswer]:
        refuse_task_token(u, "list users")
        rows = [r for r in tokens.users() if not id_prefix or str(r["id"]).startswith(id_prefix)]
        rows = [r for r in rows if not role or _has_role(r["roles"], role)]
        return cast(list[UserAnswer], rows[: max(count, 1)])

    @app.post("/api/user", response_model=None)
    def create_user(req: UserRequest, u: Caller) -> NewUserAnswer:
        refuse_task_token(u, "create users")
        if not u.admin:
            raise ForbiddenError(f"only an admin may create users; you are {u.name}")
        if any(r["id"] == req.user for r in tokens.users()):
            raise RefusedError(f"user {req.user} exists already")
        admin = _admin_role(u, req.roles)
        token = tokens.add(req.user, admin=admin, info=TokenInfo("default"))
        return {
            "id": req.user,
            "roles": ["osmo-admin", "osmo-user"] if admin else ["osmo-user"],
            "token": token,
        }


class RolesRequest(BaseModel):
    """OSMO's ``user update USER -a ROLE... -r ROLE...``."""

    add: list[str] = []
    remove: list[str] = []


def _user_row(tokens: TokenRegistry, user: str) -> UserInfoAnswer:
    row = next((r for r in tokens.users() if r["id"] == user), None)
    if row is None:
        raise NotFoundError(f"no user {user}; `user list` shows them")
    found = cast(UserAnswer, row)
    return {"id": found["id"], "roles": found["roles"], "tokens": len(tokens.tokens(user))}


def add_user_admin_routes(app: FastAPI, tokens: TokenRegistry) -> None:
    """``/api/user/{id}`` (GET, PATCH roles, DELETE) and ``/api/token/{name}/roles``."""

    @app.get("/api/user/{user}", response_model=None)
    def get_user(user: str, u: Caller) -> UserInfoAnswer:
        _for_user(u, user, "read the roles")
        return _user_row(tokens, user)

    @app.patch("/api/user/{user}", response_model=None)
    def update_user(user: str, req: RolesRequest, u: Caller) -> UserInfoAnswer:
        if not u.admin:
            raise ForbiddenError(f"only an admin may change roles; you are {u.name}")
        admin = "osmo-admin" in _user_row(tokens, user)["roles"]
        if ADMIN_ROLES & set(req.remove):
            admin = False
        if ADMIN_ROLES & set(req.add):
            admin = True
        tokens.set_admin(user, admin)
        return _user_row(tokens, user)

    @app.delete("/api/user/{user}", response_model=None)
    def delete_user(user: str, u: Caller) -> UserDeletedAnswer:
        if not u.admin:
            raise ForbiddenError(f"only an admin may delete users; you are {u.name}")
        if user == u.name:
            raise RefusedError("you may not delete yourself")
        return {"id": user, "deleted_tokens": tokens.remove_user(user)}

    @app.get("/api/token/{name}/roles", response_model=None)
    def token_roles(name: str, u: Caller) -> TokenRolesAnswer:
        row = next((r for r in tokens.tokens(u.name) if r["name"] == name), None)
        if row is None:
            raise NotFoundError(f"you have no token named {name!r}")
        return {
            "name": name,
            "roles": ["osmo-admin", "osmo-user"] if row["admin"] else ["osmo-user"],
        }


def _has_role(roles: object, wanted: list[str]) -> bool:
    """Whether a user row's ``roles`` (a list of role names) holds one of ``wanted``."""
    return isinstance(roles, list) and bool(set(wanted) & set(roles))
