"""``trainyard user list|create`` (OSMO's ``osmo user``): who may use the server.

A user is whoever holds a token; ``user create`` (admins only) gives a new user a first token,
named ``default``, printed once. OSMO's roles map onto trainyard's two kinds of user:
``osmo-admin`` an admin, anything else an ordinary user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, table

if TYPE_CHECKING:
    from trainyard.server.answers import (
        NewUserAnswer,
        UserAnswer,
        UserDeletedAnswer,
        UserInfoAnswer,
    )

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Users of the server (OSMO's `user`).")


@app.command("list")
def list_users(
    id_prefix: str | None = typer.Option(
        None, "--id-prefix", "-p", help="Only users whose name starts with this."
    ),
    roles: list[str] | None = typer.Option(
        None, "--roles", "-r", metavar="ROLE", help="Only users with one of these roles."
    ),
    count: int = typer.Option(100, "--count", "-c", min=1, help="At most this many."),
    fmt: Format = FormatOption,
) -> None:
    """List users with their roles. JSON: a list of {"id", "roles"}."""
    params: dict[str, Any] = {"count": count, "role": list(roles or [])}
    if id_prefix:
        params["id_prefix"] = id_prefix
    data: list[UserAnswer] = Client().json("GET", "/api/user", params=params)
    emit(
        data,
        fmt,
        lambda rows: table(["user", "roles"], [[r["id"], ", ".join(r["roles"])] for r in rows]),
    )


@app.command("create")
def create_user(
    user_id: str = typer.Argument(..., metavar="USER_ID"),
    roles: list[str] | None = typer.Option(
        None, "--roles", "-r", metavar="ROLE", help="osmo-admin makes an admin."
    ),
    fmt: Format = FormatOption,
) -> None:
    """Create a user (admins only) and print their first token (once). JSON: {"id",
    "roles", "token"}."""
    data: NewUserAnswer = Client().json(
        "POST", "/api/user", json={"user": user_id, "roles": list(roles or [])}
    )
    emit(
        data,
        fmt,
        lambda d: typer.echo(
            f"User {d['id']} created ({', '.join(d['roles'])}); their token: {d['token']}"
        ),
    )


UserArg = typer.Argument(..., metavar="USER_ID")


def _show(data: UserInfoAnswer) -> None:
    typer.echo(f"{data['id']}: {', '.join(data['roles'])} ({data['tokens']} token(s))")


@app.command("get")
def get_user(user_id: str = UserArg, fmt: Format = FormatOption) -> None:
    """Show a user's roles (yours, or anyone's for an admin). JSON: {"id", "roles",
    "tokens"}."""
    data: UserInfoAnswer = Client().json("GET", f"/api/user/{user_id}")
    emit(data, fmt, _show)


@app.command("update")
def update_user(
    user_id: str = UserArg,
    add_roles: list[str] | None = typer.Option(None, "--add-roles", "-a", metavar="ROLE"),
    remove_roles: list[str] | None = typer.Option(None, "--remove-roles", "-r", metavar="ROLE"),
    fmt: Format = FormatOption,
) -> None:
    """Change a user's roles (admins only): osmo-admin makes an admin, removing it an
    ordinary user. JSON as `user get`."""
    data: UserInfoAnswer = Client().json(
        "PATCH",
        f"/api/user/{user_id}",
        json={"add": list(add_roles or []), "remove": list(remove_roles or [])},
    )
    emit(data, fmt, _show)


@app.command("delete")
def delete_user(
    user_id: str = UserArg, force: bool = typer.Option(False, "--force", "-f", help="Do not ask.")
) -> None:
    """Delete a user (admins only): every token of theirs stops working."""
    import sys

    if not force and sys.stdin.isatty() and not typer.confirm(f"Delete user {user_id}?"):
        raise typer.Exit(1)
    data: UserDeletedAnswer = Client().json("DELETE", f"/api/user/{user_id}")
    typer.echo(f"User {data['id']} deleted ({data['deleted_tokens']} token(s))")
