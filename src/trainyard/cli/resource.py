"""``trainyard resource list``: every node of a pool with capacity, used and free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, human_bytes, table
from trainyard.errors import NotFoundError

if TYPE_CHECKING:
    from trainyard.server.answers import ResourceAnswer

app = typer.Typer(no_args_is_help=True, help="Nodes: capacity, used and free.")


def _cell(row: Mapping[str, Any], key: str, mode: str = "used") -> str:
    if mode == "free":
        return _value(row["free"][key], key)
    return f"{_value(row['used'][key], key)}/{_value(row['capacity'][key], key)}"


def _pools(pool: list[str], all_pools: bool) -> list[str]:
    """Which pools to show: ``--pool``'s; with ``--all`` every one; otherwise every one
    (trainyard), or as osmo the default pool (``profile set pool``) when one is set."""
    from trainyard.cli.profile import default_pool
    from trainyard.cli.progname import invoked_as_osmo

    if pool and all_pools:
        raise typer.BadParameter("give --pool or --all, not both", param_hint="'--all'")
    if pool or all_pools or not invoked_as_osmo():
        return pool
    chosen = default_pool()
    return [chosen] if chosen else []


def _rows(pool: list[str], platform: list[str]) -> list[ResourceAnswer]:
    client = Client()
    rows: list[ResourceAnswer] = []
    names: list[str | None] = [*pool] or [None]
    for name in names:
        got: list[ResourceAnswer] = client.json(
            "GET", "/api/resource", params={"pool": name} if name else {}
        )
        rows += got
    return [r for r in rows if not platform or r["platform"] in platform]


@app.command("list")
def list_resources(
    pool: list[str] | None = typer.Option(
        None, "--pool", "-p", help="Only these pools; several may follow one flag."
    ),
    platform: list[str] | None = typer.Option(
        None, "--platform", help="Only nodes of these platforms."
    ),
    all_pools: bool = typer.Option(
        False,
        "--all",
        "-a",
        help="Every pool (as osmo, without --pool or --all: your default pool, if set).",
    ),
    mode: str = typer.Option(
        "used", "--mode", "-m", help="used: used/capacity per resource; free: what is free."
    ),
    fmt: Format = FormatOption,
) -> None:
    """List every node with used/capacity (or free, --mode free) of cpu, gpu, memory and
    storage. A node of a pool without `strict: true` (such as the default `local` pool) is
    marked virtual: its capacity is declared (GPU slots run as CPU processes), not
    measured. JSON: a list of {"pool", "node", "platform", "capacity", "used", "free",
    "virtual"}."""
    if mode not in ("used", "free"):
        raise typer.BadParameter(f"{mode!r} is not one of 'free', 'used'", param_hint="'--mode'")
    data = _rows(_pools(list(pool or []), all_pools), list(platform or []))
    emit(data, fmt, lambda rows: _table(rows, mode))


@app.command("info")
def info(
    node: str = typer.Argument(..., metavar="NODE_NAME", help="The node's name."),
    pool: str | None = typer.Option(None, "--pool", "-p", help="Its pool (when names repeat)."),
    platform: str | None = typer.Option(None, "--platform", "-pl", help="Its platform."),
    fmt: Format = FormatOption,
) -> None:
    """Show one node: pool, platform, and capacity, used and free of each resource. JSON:
    a list of {"pool", "node", "platform", "capacity", "used", "free", "virtual"} (one per
    pool that has a node of that name). An unknown node exits 3."""
    rows = [
        r
        for r in _rows([pool] if pool else [], [platform] if platform else [])
        if r["node"] == node
    ]
    if not rows:
        raise NotFoundError(
            f"no node {node!r}"
            + (f" in pool {pool}" if pool else "")
            + "; `resource list -a` lists them"
        )
    emit(rows, fmt, _info_table)


def _info_table(rows: list[ResourceAnswer]) -> None:
    for row in rows:
        console.print(
            f"Node {row['node']} (pool {row['pool']}, platform "
            f"{row['platform'] or '-'}, {'virtual' if row.get('virtual') else 'real'})",
            markup=False,
        )
        table(
            ["resource", "capacity", "used", "free"],
            [
                [
                    key.removesuffix("_bytes"),
                    *(_value(part[key], key) for part in _parts(row)),
                ]
                for key in ("cpu", "gpu", "memory_bytes", "storage_bytes")
            ],
        )


def _parts(row: ResourceAnswer) -> tuple[Mapping[str, Any], ...]:
    """A node's capacity, used and free, in that order."""
    return (row["capacity"], row["used"], row["free"])


def _value(value: float, key: str) -> str:
    return human_bytes(value) if key.endswith("_bytes") else f"{value:g}"


def _table(rows: list[ResourceAnswer], mode: str = "used") -> None:
    """One table per pool (its name above it), each node marked virtual or real."""
    for pool in dict.fromkeys(r["pool"] for r in rows):
        table(
            ["node", "platform", "cpu", "gpu", "memory", "storage", "capacity"],
            [
                [
                    r["node"],
                    r["platform"] or "-",
                    _cell(r, "cpu", mode),
                    _cell(r, "gpu", mode),
                    _cell(r, "memory_bytes", mode),
                    _cell(r, "storage_bytes", mode),
                    "virtual" if r.get("virtual") else "real",
                ]
                for r in rows
                if r["pool"] == pool
            ],
            title=f"pool {pool}",
        )
    if any(r.get("virtual") for r in rows):
        console.print(
            "virtual: capacity the pool declares (it has no `strict: true`), not\n"
            "measured; GPU slots run as CPU processes where there are no GPUs\n"
            "(docs/pools.md).",
            markup=False,
        )
