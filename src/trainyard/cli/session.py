"""``trainyard login URL`` and ``logout`` (OSMO's ``osmo login`` and ``osmo logout``).

trainyard servers take tokens (``server add-user``, ``user create``, ``token set``), so the
one login method is OSMO's ``--method token``: ``login URL --token T`` (or ``--token-file
F``) checks the token against the server, then keeps both in ``$TRAINYARD_HOME/login.json``
(0600); every later command talks to that server with that token, unless
``TRAINYARD_SERVER_URL`` or ``TRAINYARD_TOKEN`` say otherwise. ``logout`` forgets them: the
CLI goes back to this machine's own server. OSMO's browser and password methods have no
counterpart (refused with exit 2, saying so).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from trainyard.home import trainyard_home

if TYPE_CHECKING:
    from trainyard.server.answers import WhoamiAnswer

__all__ = ["login", "logout"]

METHODS = ("token", "code", "password", "dev")
"""OSMO's login methods; trainyard takes ``token``."""


def _token_of(token: str | None, token_file: Path | None) -> str:
    if token and token_file:
        raise typer.BadParameter("give --token or --token-file, not both", param_hint="'--token'")
    if token_file is not None:
        try:
            return token_file.read_text().strip()
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {token_file}: {exc.strerror}", param_hint="'--token-file'"
            ) from exc
    if not token:
        raise typer.BadParameter(
            "a trainyard server takes a token: give --token TOKEN or "
            "--token-file FILE (an admin makes one with `user create` or "
            "`server add-user`)",
            param_hint="'--token'",
        )
    return token.strip()


def login(
    url: str = typer.Argument(..., metavar="URL", help="The server (http://host:port)."),
    method: str = typer.Option("token", "--method", help="token (the one trainyard has)."),
    token: str | None = typer.Option(None, "--token", help="Your access token."),
    token_file: Path | None = typer.Option(None, "--token-file", help="A file holding it."),
    username: str | None = typer.Option(
        None, "--username", help="OSMO's dev/password methods; not used here."
    ),
    password: str | None = typer.Option(
        None, "--password", help="OSMO's password method: refused (tokens only)."
    ),
    password_file: Path | None = typer.Option(None, "--password-file", help="As --password."),
    device_endpoint: str | None = typer.Option(
        None, "--device-endpoint", help="OSMO's device-code login: refused."
    ),
    browser_endpoint: str | None = typer.Option(
        None, "--browser-endpoint", help="OSMO's browser login: refused."
    ),
    callback_port: int | None = typer.Option(
        None, "--callback-port", help="As --browser-endpoint."
    ),
) -> None:
    """Log in to a trainyard server with a token: later commands use that server. OSMO's
    password, device-code and browser logins are refused (exit 2, saying so)."""
    from trainyard.cli.client import Client
    from trainyard.server.auth import write_login

    if method != "token":
        raise typer.BadParameter(
            f"{method!r}: trainyard servers take tokens only (--method token)",
            param_hint="'--method'",
        )
    others = {
        "--username": username,
        "--password": password,
        "--password-file": password_file,
        "--device-endpoint": device_endpoint,
        "--browser-endpoint": browser_endpoint,
        "--callback-port": callback_port,
    }
    given = [flag for flag, value in others.items() if value is not None]
    if given:
        raise typer.BadParameter(
            f"{given[0]} belongs to OSMO's password, device-code or "
            "browser login; a trainyard server takes a token (--token)",
            param_hint=f"'{given[0]}'",
        )
    secret = _token_of(token, token_file)
    who: WhoamiAnswer = Client(url=url.rstrip("/"), token=secret).json("GET", "/api/whoami")
    write_login(trainyard_home(), url.rstrip("/"), secret)
    typer.echo(f"Logged in to {url.rstrip('/')} as {who['user']}")


def logout() -> None:
    """Forget the server and token of `login` (this machine's own server is used again)."""
    from trainyard.server.auth import LOGIN_FILE

    path = trainyard_home() / LOGIN_FILE
    if path.exists():
        path.unlink()
        typer.echo("Logged out")
    else:
        typer.echo("Not logged in")
