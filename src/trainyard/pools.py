"""Pools: named sets of nodes a workflow runs on, read from ``$TRAINYARD_HOME/pools.yaml``.

A pool names its backend (``local``, ``slurm``, ``kubernetes``), its nodes with their
capacity, and settings (retry cap, backfill age, backend options, images, egress,
``allow_host_network``). The default pool ``local`` is a *rehearsal* pool: virtual nodes on
this machine that declare enough for OSMO's training examples (per node 8 GPU slots, 64 CPUs,
512 GiB memory, 2 TiB storage). ``strict: true`` declares real capacity: a strict local pool
is one node measured here (``machine_capacity``), a strict cluster pool keeps what its file
declares; a spec asking more is refused at submission (``spec.poolfit``). This module only
parses. File format and every key: docs/pools.md.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psutil
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainyard.errors import ConfigError
from trainyard.home import trainyard_home
from trainyard.quantity import parse_quantity

__all__ = [
    "MAX_POOL_EXIT_CODE",
    "POOL_EXIT_ACTIONS",
    "NodeSpec",
    "Pool",
    "trainyard_home",
    "default_local_pool",
    "load_pools",
    "machine_capacity",
    "real_gpu_count",
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


POOL_EXIT_ACTIONS = ("COMPLETE", "FAIL", "RESCHEDULE")
"""The actions a pool's ``default_exit_actions`` may name (OSMO's)."""
MAX_POOL_EXIT_CODE = 4000
"""The highest exit code OSMO gives a task (4000, unknown error; OSMO docs, "Exit codes")."""
_CODES = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def _check_codes(action: str, codes: str) -> None:
    """Raises ValueError, saying what to write, unless ``codes`` is codes and ranges within
    0-``MAX_POOL_EXIT_CODE`` (``"3001,3005"``, ``"1-10,16"``)."""
    for part in codes.split(","):
        match = _CODES.match(part)
        low = int(match.group(1)) if match else -1
        high = int(match.group(2) or low) if match else -1
        if not match or high < low or high > MAX_POOL_EXIT_CODE:
            raise ValueError(
                f"default_exit_actions.{action}: {part.strip()!r} is not a code "
                f"or range of codes within 0-{MAX_POOL_EXIT_CODE}; write e.g. "
                "'3001,3005' or '1-10,16'"
            )


class Pool(BaseModel):
    """A named pool of nodes behind one backend."""

    model_config = ConfigDict(extra="forbid")

    name: str
    backend: str = "local"
    strict: bool = False
    max_retries: int = 3
    backfill_age_s: float = Field(default=300.0, ge=0)
    """How long the head of the pool's queue lets smaller gangs behind it start first
    (backfill); after that it holds every gang behind it until it fits (``engine.scheduler``).
    0: no backfill, strict queue order."""
    nodes: list[NodeSpec]
    options: dict[str, Any] = Field(default_factory=dict)
    images: dict[str, str] = Field(default_factory=dict)
    egress: bool = True
    allow_host_network: bool = False
    default_exit_actions: dict[str, str] = Field(default_factory=dict)
    """OSMO's pool field: exit action (COMPLETE, FAIL, RESCHEDULE) -> exit codes in the spec's
    form (``"3001,3005"``, ``"1-10,16"``), for the codes a task's own ``exitActions`` do not
    cover. Unlike a spec's, its codes may be OSMO's service codes (up to
    ``MAX_POOL_EXIT_CODE``): ``RESCHEDULE: 3001,3005`` retries backend errors and start
    timeouts (OSMO's ``UpdateGroup._apply_exit_action`` applies the task's actions, then
    the pool's, to every code). Parsed by the engine when a workflow is submitted."""

    @field_validator("default_exit_actions")
    @classmethod
    def _osmo_exit_actions(cls, value: dict[str, str]) -> dict[str, str]:
        """Each key an OSMO action, each value codes and ranges within 0-4000."""
        for action, codes in value.items():
            if action not in POOL_EXIT_ACTIONS:
                raise ValueError(
                    f"default_exit_actions: {action!r} is not an action; use "
                    f"{', '.join(POOL_EXIT_ACTIONS)}"
                )
            _check_codes(action, str(codes))
        return {action: str(codes) for action, codes in value.items()}

    @field_validator("images", mode="before")
    @classmethod
    def _one_runtime_for_all(cls, value: Any) -> Any:
        """``images: podman`` is ``images: {"*": podman}``."""
        return {"*": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _measure_if_strict(self) -> Pool:
        """A strict pool is this machine as it is: one local node with its real capacity."""
        if not self.strict or self.backend != "local":
            return self  # a cluster pool's nodes are its real ones, as declared
        if len(self.nodes) != 1:
            raise ValueError(
                f"a strict pool is this one machine: give it exactly one node "
                f"(got {len(self.nodes)})"
            )
        self.nodes = [self.nodes[0].model_copy(update=machine_capacity())]
        return self

    @property
    def node_per_task(self) -> bool:
        """Whether each task of a group needs a node of its own: on Slurm a group is one job
        that allocates one node per task, so a gang never shares a node there."""
        return self.backend == "slurm"

    @property
    def platforms(self) -> set[str]:
        """Platforms some node of the pool declares."""
        return {n.platform for n in self.nodes if n.platform}


@functools.lru_cache(maxsize=1)
def real_gpu_count() -> int:
    """How many GPUs ``nvidia-smi -L`` lists on this machine (0 without nvidia-smi or when it
    fails). Asked once per process."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in done.stdout.splitlines())


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine_capacity() -> dict[str, Any]:
    """This machine's real capacity, as ``NodeSpec`` fields: ``cpu`` (usable CPUs), ``gpu``
    (``real_gpu_count``), ``memory_bytes`` (total RAM) and ``storage_bytes`` (size of the
    file system holding ``$TRAINYARD_HOME``, where task folders live)."""
    return {
        "cpu": float(_usable_cpus()),
        "gpu": real_gpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "storage_bytes": int(shutil.disk_usage(trainyard_home()).total),
    }


def default_local_pool(node_count: int = 4) -> Pool:
    """The rehearsal pool ``local``: ``node_count`` virtual nodes on this machine."""
    nodes = [NodeSpec(name=f"local-{i}") for i in range(node_count)]
    return Pool(name=DEFAULT_POOL, backend="local", nodes=nodes)


def _expand_nodes(name: str, body: dict[str, Any]) -> dict[str, Any]:
    body = dict(body)
    if "nodes" not in body:
        count = int(body.pop("node_count", 1 if body.get("strict") else 4))
        template = dict(body.pop("node", {}))
        body["nodes"] = [{**template, "name": f"{name}-{i}"} for i in range(count)]
    return body


def load_pools(path: Path | None = None) -> dict[str, Pool]:
    """Read the pools file (default ``$TRAINYARD_HOME/pools.yaml``).

    The ``local`` pool always exists; the file may redefine it. Every pool of the file is
    returned, whether or not its backend is installed here (``backends.served`` sets those
    apart).

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
