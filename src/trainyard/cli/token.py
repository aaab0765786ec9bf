"""``trainyard token set|list|delete`` (OSMO's ``osmo token``): named access tokens.

A token made here is printed once; keep it (``TRAINYARD_TOKEN``, or ``login URL --token``).
An admin manages another user's tokens with ``-u USER``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, table

if TYPE_CHECKING:
    from trainyard.server.answers import (
        NewTokenAnswer,
        TokenAnswer,
        TokenDeletedAnswer,
        TokenRolesAnswer,
    )

__all__ = ["app"]

app = typer.Typer(no_args_is_help=True, help="Named access tokens (OSMO's `token`).")

UserOpt = typer.Option(None, "--user", "-u", help="Another user's tokens (admins only).")


@app.command("set")
def set_token(
    name: str = typer.Argument(..., metavar="NAME", help="The token's name (one per user)."),
    expires_at: str | None = typer.Option(
        None,
        "--expires-at",
        "-e",
        metavar="YYYY-MM-DD",
        help="Its last day (UTC); default: no expiry.",
    ),
    description: str = typer.Option("", "--description", "-d", help="What it is for."),
    user: str | None = UserOpt,
    roles: list[str] | None = typer.Option(
        None,
        "--roles",
        "-r",
        metavar="ROLE",
        help="OSMO roles: osmo-admin makes an admin "
        "token (admins only); others an ordinary user's.",
    ),
    fmt: Format = FormatOption,
) -> None:
    """Make a named token and print it (once). JSON: {"user", "name", "token",
    "expires_at", "description"}."""
    body: dict[str, Any] = {
        "name": name,
        "expires_at": expires_at,
        "description": description,
        "user": user,
        "roles": list(roles or []),
    }
    data: NewTokenAnswer = Client().json("POST", "/api/token", json=body)
    emit(data, fmt, lambda d: typer.echo(d["token"]))


@app.command("list")
def list_tokens(user: str | None = UserOpt, fmt: Format = FormatOption) -> None:
    """List your tokens (never the tokens themselves). JSON: a list of {"user", "name",
    "admin", "description", "expires_at"}."""
    data: list[TokenAnswer] = Client().json(
        "GET", "/api/token", params={"user": user} if user else {}
    )
    emit(
        data,
        fmt,
        lambda rows: table(
            ["name", "user", "admin", "expires", "description"],
            [
                [
                    r["name"] or "-",
                    r["user"],
                    "yes" if r["admin"] else "no",
                    r["expires_at"] or "never",
                    r["description"] or "-",
                ]
                for r in rows
            ],
        ),
    )


@app.command("delete")
def delete_token(
    name: str = typer.Argument(..., metavar="NAME"), user: str | None = UserOpt
) -> None:
    """Delete your token NAME (it stops working at once)."""
    _: TokenDeletedAnswer = Client().json(
        "DELETE", f"/api/token/{name}", params={"user": user} if user else {}
    )
    typer.echo(f"Token {name} deleted")


@app.command("roles")
def roles(name: str = typer.Argument(..., metavar="NAME"), fmt: Format = FormatOption) -> None:
    """The roles of your token NAME. JSON: {"name", "roles"}."""
    data: TokenRolesAnswer = Client().json("GET", f"/api/token/{name}/roles")
    emit(data, fmt, lambda d: typer.echo(", ".join(d["roles"])))
