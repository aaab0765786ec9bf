"""``trainyard version`` (``osmo version``): the CLI's version and the server's."""

from __future__ import annotations

from typing import Any

import typer

from trainyard import __version__
from trainyard.cli.output import Format, FormatOption, emit

__all__ = ["version"]


def version(fmt: Format = FormatOption) -> None:
    """Print trainyard's version, and the server's when one answers (never starts one).
    JSON: {"version", "server": {"url", "version"} or null}."""
    from trainyard.cli.client import server_version

    server = server_version()
    data = {
        "version": __version__,
        "server": None if server is None else {"url": server[0], "version": server[1]},
    }
    emit(data, fmt, _print_version)


def _print_version(data: dict[str, Any]) -> None:
    typer.echo(f"trainyard {data['version']}")
    server = data["server"]
    if server is not None:
        typer.echo(f"server {server['version']} at {server['url']}")
