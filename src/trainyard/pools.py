"""Pools: named sets of nodes a workflow runs on, read from ``$TRAINYARD_HOME/pools.yaml``.

A pool names its backend (``local``, ``slurm``, ``kubernetes``), its nodes with their
capacity, and settings (retry cap, backend options). The default pool ``local`` is a
*rehearsal* pool: virtual nodes sharing this machine that declare enough to hold OSMO's
training examples unchanged (per node 8 GPU slots, 64 CPUs, 512 GiB memory, 2 TiB storage).
A pool with ``strict: true`` declares the machine's real capacity instead.

File format (YAML)::

    pools:
      my-pool:
        backend: local            # local | slurm | kubernetes
        strict: false
        max_retries: 3            # per task, RESCHEDULE and RESTART together
        nodes:                    # or node_count + node (one template for all)
          - {name: n0, cpu: 64, gpu: 8, memory: 512Gi, storage: 2Ti, platform: dgx-h100}
        options: {partition: batch, account: ml}   # backend-specific
        images: {busybox: busybox}                 # image -> local runtime (local backend)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trainyard.errors import ConfigError, NotFoundError
from trainyard.quantity import parse_quantity

__all__ = [
    "NodeSpec",
    "Pool",
    "trainyard_home",
    "default_local_pool",
    "load_pools",
    "get_pool",
    "DEFAULT_POOL",
]

DEFAULT_POOL = "local"
GiB = 1024**3
TiB = 1024**4


class NodeSpec(BaseModel):
    """One node of a pool and what it can hold."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str
    cpu: float = 64
    gpu: int = 8
    memory_bytes: int = Field(default=512 * GiB, alias="memory")
    storage_bytes: int = Field(default=2 * TiB, alias="storage")
    platform: str | None = None
    hostname: str | None = None

    @field_validator("memory_bytes", "storage_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> int:
        return int(parse_quantity(value))

    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> float:
        return float(parse_quantity(value))


class Pool(BaseModel):
    """A named pool of nodes behind one backend."""

    model_config = ConfigDict(extra="forbid")

    name: str
    backend: str = "local"
    strict: bool = False
    max_retries: int = 3
    nodes: list[NodeSpec]
    options: dict[str, Any] = Field(default_factory=dict)
    images: dict[str, str] = Field(default_factory=dict)

    @property
    def platforms(self) -> set[str]:
        """Platforms some node of the pool declares."""
        return {n.platform for n in self.nodes if n.platform}


def trainyard_home() -> Path:
    """Where trainyard keeps its state: ``$TRAINYARD_HOME``, else the XDG data folder
    (``$XDG_DATA_HOME/trainyard``, default ``~/.local/share/trainyard``). Created if absent."""
    env = os.environ.get("TRAINYARD_HOME")
    if env:
        home = Path(env)
    else:
        base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
        home = Path(base) / "trainyard"
    home.mkdir(parents=True, exist_ok=True)
    return home


def default_local_pool(node_count: int = 4) -> Pool:
    """The rehearsal pool ``local``: ``node_count`` virtual nodes on this machine."""
    nodes = [NodeSpec(name=f"local-{i}") for i in range(node_count)]
    return Pool(name=DEFAULT_POOL, backend="local", nodes=nodes)


def _expand_nodes(name: str, body: dict[str, Any]) -> dict[str, Any]:
    body = dict(body)
    if "nodes" not in body:
        count = int(body.pop("node_count", 4))
        template = dict(body.pop("node", {}))
        body["nodes"] = [{**template, "name": f"{name}-{i}"} for i in range(count)]
    return body


def load_pools(path: Path | None = None) -> dict[str, Pool]:
    """Read the pools file (default ``$TRAINYARD_HOME/pools.yaml``).

    The ``local`` pool always exists; the file may redefine it.

    Raises:
        ConfigError: the file is not valid YAML or a pool is malformed (names the pool).
    """
    path = path or trainyard_home() / "pools.yaml"
    pools = {DEFAULT_POOL: default_local_pool()}
    if not path.exists():
        return pools
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    for name, body in (data.get("pools") or {}).items():
        try:
            pools[name] = Pool(name=name, **_expand_nodes(name, body or {}))
        except (ValidationError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: pool {name!r}: {exc}") from exc
    return pools


def get_pool(name: str | None, path: Path | None = None) -> Pool:
    """The pool called ``name`` (``local`` when ``None``).

    Raises:
        NotFoundError: no such pool; the message lists the pools that exist.
    """
    pools = load_pools(path)
    name = name or DEFAULT_POOL
    if name not in pools:
        raise NotFoundError(
            f"unknown pool {name!r}; pools: {', '.join(sorted(pools))} "
            f"(add one to {trainyard_home() / 'pools.yaml'})"
        )
    return pools[name]
