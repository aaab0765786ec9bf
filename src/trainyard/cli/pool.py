"""``trainyard pool list``: the pools workflows run on."""

from __future__ import annotations

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, table

app = typer.Typer(no_args_is_help=True, help="Pools workflows run on.")


@app.command("list")
def list_pools(fmt: Format = FormatOption) -> None:
    """List pools."""
    data = Client().json("GET", "/api/pool")
    emit(data, fmt, lambda rows: table(
        ["pool", "backend", "nodes", "platforms", "max retries"],
        [[p["name"], p["backend"], p["nodes"], ",".join(p["platforms"]) or "-", p["max_retries"]]
         for p in rows]))
