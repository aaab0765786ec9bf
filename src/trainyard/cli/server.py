"""``trainyard server start|stop|status|token``: the local server, explicitly."""

from __future__ import annotations

import typer

from trainyard.cli.output import console
from trainyard.errors import ServerError
from trainyard.pools import trainyard_home
from trainyard.server import process
from trainyard.server.auth import TokenRegistry

app = typer.Typer(no_args_is_help=True, help="Start, stop and inspect the trainyard server.")


@app.command()
def start(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0 for a team)"),
    port: int = typer.Option(0, "--port", help="port (0: any free port)"),
) -> None:
    """Start the server in the background (state in $TRAINYARD_HOME)."""
    home = trainyard_home()
    info = process.read_info(home)
    if info is not None and process.is_alive(info):
        console.print(f"trainyard server already running at {info.url} (pid {info.pid})")
        return
    info = process.start_background(home, host=host, port=port)
    console.print(f"trainyard server running at {info.url} (pid {info.pid}); token in {home / 'token'}")


@app.command()
def stop() -> None:
    """Stop the background server. Running tasks keep running; a new server resumes them."""
    if process.stop(trainyard_home()):
        console.print("trainyard server stopped")
    else:
        console.print("no trainyard server was running")


@app.command()
def status() -> None:
    """Say whether the server runs and where."""
    info = process.read_info(trainyard_home())
    if info is None or not process.is_alive(info):
        raise ServerError("no trainyard server is running; start one with `trainyard server start`")
    console.print(f"trainyard server running at {info.url} (pid {info.pid})")


@app.command("add-user")
def add_user(user: str, admin: bool = typer.Option(False, "--admin")) -> None:
    """Create a token for USER (run on the server's machine, as its owner); prints it."""
    token = TokenRegistry(trainyard_home()).add(user, admin=admin)
    typer.echo(token)
