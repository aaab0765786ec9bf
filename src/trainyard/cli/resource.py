"""``trainyard resource list``: every node of a pool with capacity, used and free."""

from __future__ import annotations

from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, console, emit, human_bytes, table

app = typer.Typer(no_args_is_help=True, help="Nodes: capacity, used and free.")


def _cell(row: dict, key: str) -> str:
    fmt = human_bytes if key.endswith("_bytes") else (lambda v: f"{v:g}")
    return f"{fmt(row['used'][key])}/{fmt(row['capacity'][key])}"


@app.command("list")
def list_resources(pool: Optional[str] = typer.Option(None, "--pool"),
                   fmt: Format = FormatOption) -> None:
    """List every node with used/capacity of cpu, gpu, memory and storage. A node of a
    pool without `strict: true` (such as the default `local` pool) is marked virtual: its
    capacity is declared (GPU slots run as CPU processes), not measured. JSON: a list of
    {"pool", "node", "platform", "capacity", "used", "free", "virtual"}."""
    data = Client().json("GET", "/api/resource", params={"pool": pool} if pool else {})
    emit(data, fmt, _table)


def _table(rows: list[dict]) -> None:
    """One table per pool (its name above it), each node marked virtual or real."""
    for pool in dict.fromkeys(r["pool"] for r in rows):
        table(["node", "platform", "cpu", "gpu", "memory", "storage", "capacity"],
              [[r["node"], r["platform"] or "-", _cell(r, "cpu"), _cell(r, "gpu"),
                _cell(r, "memory_bytes"), _cell(r, "storage_bytes"),
                "virtual" if r.get("virtual") else "real"] for r in rows if r["pool"] == pool],
              title=f"pool {pool}")
    if any(r.get("virtual") for r in rows):
        console.print("virtual: capacity the pool declares (it has no `strict: true`), not\n"
                      "measured; GPU slots run as CPU processes where there are no GPUs\n"
                      "(docs/pools.md).", markup=False)
