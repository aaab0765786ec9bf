"""``trainyard dashboard [WORKFLOW_ID]``: open the web dashboard, already logged in.

The server makes a one-time login link (``POST /api/login-link``: good for one use within
``LOGIN_CODE_TTL_S``, then a session cookie like the login page's); this command prints it
and opens it in the default browser when there is one (``webbrowser``; ``--no-open``: print
only). The CLI starts the local server first when none runs, as every command does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from trainyard.server.answers import LoginLinkAnswer

__all__ = ["dashboard"]


def dashboard(
    workflow_id: str | None = typer.Argument(
        None, metavar="[WORKFLOW_ID]", help="Open this workflow's page instead of the list."
    ),
    no_open: bool = typer.Option(False, "--no-open", help="Print the link; open no browser."),
) -> None:
    """Open the dashboard in a browser, logged in: prints a one-time login link (one use,
    valid 2 minutes) and opens it. Bookmark the address it names: the local server keeps
    its port across restarts."""
    from trainyard.cli.client import Client  # here: every command's start builds this one
    from trainyard.cli.output import console

    client = Client()
    target = f"/workflows/{workflow_id}" if workflow_id else "/"
    link: LoginLinkAnswer = client.json("POST", "/api/login-link", params={"next": target})
    url = client.url.rstrip("/") + link["path"]
    console.print(f"Dashboard: {client.url.rstrip('/')}{target}", markup=False, highlight=False)
    console.print(
        f"One-time login link (one use, valid {link['expires_in_s']} s):",
        markup=False,
        highlight=False,
    )
    typer.echo(url)
    if not no_open and not _open(url):
        console.print(
            "(no browser to open here: open the link above in yours, e.g. through "
            "`ssh -L PORT:127.0.0.1:PORT` from a remote machine)",
            markup=False,
            highlight=False,
        )


def _open(url: str) -> bool:
    """Open ``url`` in the default browser; False when there is none (a headless machine)."""
    import webbrowser

    try:
        return webbrowser.open(url)
    except webbrowser.Error:
        return False
