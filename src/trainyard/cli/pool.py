"""``trainyard pool list|reload``: the pools workflows run on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, err_console, table
from trainyard.errors import NotFoundError

if TYPE_CHECKING:
    from trainyard.server.answers import PoolAnswer, PoolReloadAnswer, ResourceAnswer

app = typer.Typer(no_args_is_help=True, help="Pools workflows run on.")


def _gpu_totals(client: Client) -> dict[str, dict[str, float]]:
    """Per pool: its nodes' GPUs, ``capacity``, ``used`` and ``free`` (OSMO's totals)."""
    totals: dict[str, dict[str, float]] = {}
    nodes: list[ResourceAnswer] = client.json("GET", "/api/resource")
    for node in nodes:
        pool = totals.setdefault(node["pool"], {"capacity": 0, "used": 0, "free": 0})
        pool["capacity"] += node["capacity"]["gpu"]
        pool["used"] += node["used"]["gpu"]
        pool["free"] += node["free"]["gpu"]
    return totals


@app.command("list")
def list_pools(
    pool: list[str] | None = typer.Option(
        None, "--pool", "-p", help="Only these pools; several may follow one flag."
    ),
    mode: str = typer.Option(
        "used", "--mode", "-m", help="used: GPUs in use; free: GPUs free (OSMO's modes)."
    ),
    fmt: Format = FormatOption,
) -> None:
    """List pools with their GPUs: total capacity, and used or free (--mode). JSON: a list
    of {"name", "backend", "nodes", "platforms", "max_retries", "gpu": {"capacity", "used",
    "free"}}."""
    if mode not in ("used", "free"):
        raise typer.BadParameter(f"{mode!r} is not one of 'free', 'used'", param_hint="'--mode'")
    client = Client()
    pools: list[PoolAnswer] = client.json("GET", "/api/pool")
    unknown = sorted(set(pool or []) - {p["name"] for p in pools})
    if unknown:
        raise NotFoundError(
            f"unknown pool {unknown[0]!r}; pools: {', '.join(sorted(p['name'] for p in pools))}"
        )
    totals = _gpu_totals(client)
    data = [
        {**p, "gpu": totals.get(p["name"], {"capacity": 0, "used": 0, "free": 0})}
        for p in pools
        if not pool or p["name"] in pool
    ]
    emit(
        data,
        fmt,
        lambda rows: table(
            ["pool", "backend", "nodes", "platforms", "max retries", f"gpu {mode}", "gpu total"],
            [
                [
                    p["name"],
                    p["backend"],
                    p["nodes"],
                    ",".join(p["platforms"]) or "-",
                    p["max_retries"],
                    f"{p['gpu'][mode]:g}",
                    f"{p['gpu']['capacity']:g}",
                ]
                for p in rows
            ],
        ),
    )


def _print_reload(data: PoolReloadAnswer) -> None:
    console.print(f"Pools read from {data['file']}: {', '.join(data['pools'])}", markup=False)
    for _name, reason in sorted(data["refused"].items()):
        err_console.print(f"not served: {reason}", markup=False)
    for name in data["kept"]:
        err_console.print(
            f"pool {name} kept as it was while workflows use it; the edit applies once they end",
            markup=False,
        )


@app.command("reload")
def reload_pools(fmt: Format = FormatOption) -> None:
    """Make the server read $TRAINYARD_HOME/pools.yaml again now (it also does so by itself
    when the file's modification time changes). A file that does not load is refused
    whole (exit 4, one line saying why) and the server keeps its pools. A pool that
    workflows use keeps its old definition until they end. JSON: {"pools", "refused",
    "kept", "error", "file"}."""
    reloaded: PoolReloadAnswer = Client().json("POST", "/api/pool/reload")
    emit(reloaded, fmt, _print_reload)
