"""``trainyard server start|stop|status|add-user``: the local server, explicitly.

The admin token of the server's owner is written at first start to ``$TRAINYARD_HOME/token``
(readable only by its owner); ``add-user`` creates tokens for other users.
``trainyard.server.process`` (httpx with it) and ``server.auth`` are imported by the commands
that use them.
"""

from __future__ import annotations

import typer

from trainyard.cli.output import Format, FormatOption, console, emit
from trainyard.errors import ServerError
from trainyard.home import trainyard_home

app = typer.Typer(no_args_is_help=True, help="Start, stop and inspect the trainyard server.")


@app.command()
def start(
    host: str = typer.Option(
        "127.0.0.1", "--host", help="address to listen on (0.0.0.0 for a team)"
    ),
    port: int = typer.Option(0, "--port", help="port (0: any free port)"),
) -> None:
    """Start the server in the background (state in $TRAINYARD_HOME)."""
    from trainyard.server import process

    home = trainyard_home()
    info, started = process.start(home, host=host, port=port)
    if not started:
        console.print(f"trainyard server already running at {info.url} (pid {info.pid})")
        return
    console.print(
        f"trainyard server running at {info.url} (pid {info.pid}); token in {home / 'token'}"
    )


@app.command()
def stop() -> None:
    """Stop the server holding this home's lock (even if server.json was removed). Running
    tasks keep running; a new server resumes them."""
    from trainyard.server import process

    if process.stop(trainyard_home()):
        console.print("trainyard server stopped")
    else:
        console.print("no trainyard server was running")


@app.command()
def status(fmt: Format = FormatOption) -> None:
    """Say whether this machine's server runs and where; exit 7 when it does not.

    JSON: {"running": bool, "url": str or null, "pid": int or null}, printed in both cases.
    """
    from trainyard.server import process

    info = process.find_running(trainyard_home())
    if fmt is Format.json:
        emit(
            {
                "running": info is not None,
                "url": info.url if info else None,
                "pid": info.pid if info else None,
            },
            fmt,
            lambda _d: None,
        )
    if info is None:
        raise ServerError("no trainyard server is running; start one with `trainyard server start`")
    if fmt.human:
        console.print(f"trainyard server running at {info.url} (pid {info.pid})")


@app.command("add-user")
def add_user(
    user: str = typer.Argument(..., metavar="USER", help="The user's name."),
    admin: bool = typer.Option(
        False, "--admin", help="May read and change every user's workflows and apps."
    ),
) -> None:
    """Create a token for USER (run on the server's machine, as its owner); prints it."""
    from trainyard.server.auth import TokenRegistry

    token = TokenRegistry(trainyard_home()).add(user, admin=admin)
    typer.echo(token)
