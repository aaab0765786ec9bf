"""``trainyard resource list``: every node of a pool with capacity, used and free."""

from __future__ import annotations

from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.output import Format, FormatOption, emit, human_bytes, table

app = typer.Typer(no_args_is_help=True, help="Nodes: capacity, used and free.")


def _cell(row: dict, key: str) -> str:
    fmt = human_bytes if key.endswith("_bytes") else (lambda v: f"{v:g}")
    return f"{fmt(row['used'][key])}/{fmt(row['capacity'][key])}"


@app.command("list")
def list_resources(pool: Optional[str] = typer.Option(None, "--pool"),
                   fmt: Format = FormatOption) -> None:
    """List every node with used/capacity of cpu, gpu, memory and storage."""
    data = Client().json("GET", "/api/resource", params={"pool": pool} if pool else {})
    emit(data, fmt, lambda rows: table(
        ["pool", "node", "platform", "cpu", "gpu", "memory", "storage"],
        [[r["pool"], r["node"], r["platform"] or "-", _cell(r, "cpu"), _cell(r, "gpu"),
          _cell(r, "memory_bytes"), _cell(r, "storage_bytes")] for r in rows]))
