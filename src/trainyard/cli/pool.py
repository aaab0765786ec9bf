"""``trainyard pool list|reload``: the pools workflows run on."""

from __future__ import annotations

from typing import Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, err_console, table

app = typer.Typer(no_args_is_help=True, help="Pools workflows run on.")


@app.command("list")
def list_pools(fmt: Format = FormatOption) -> None:
    """List pools."""
    data = Client().json("GET", "/api/pool")
    emit(data, fmt, lambda rows: table(
        ["pool", "backend", "nodes", "platforms", "max retries"],
        [[p["name"], p["backend"], p["nodes"], ",".join(p["platforms"]) or "-", p["max_retries"]]
         for p in rows]))


def _print_reload(data: dict[str, Any]) -> None:
    console.print(f"Pools read from {data['file']}: {', '.join(data['pools'])}", markup=False)
    for name, reason in sorted(data["refused"].items()):
        err_console.print(f"not served: {reason}", markup=False)
    for name in data["kept"]:
        err_console.print(f"pool {name} kept as it was while workflows use it; the edit "
                          "applies once they end", markup=False)


@app.command("reload")
def reload_pools(fmt: Format = FormatOption) -> None:
    """Make the server read $TRAINYARD_HOME/pools.yaml again now (it also does so by itself
    when the file's modification time changes). A file that does not load is refused
    whole (exit 4, one line saying why) and the server keeps its pools. A pool that
    workflows use keeps its old definition until they end. JSON: {"pools", "refused",
    "kept", "error", "file"}."""
    emit(Client().json("POST", "/api/pool/reload"), fmt, _print_reload)
