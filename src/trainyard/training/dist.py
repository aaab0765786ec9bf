"""The distributed environment a training process runs in.

torchrun (and :mod:`trainyard.training.launch`) describe each worker with ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node's rank),
``GROUP_WORLD_SIZE`` (node count), ``MASTER_ADDR``/``MASTER_PORT``; without them the process is
a world of one (an in-memory store, so DDP, all-reduce and barrier run the same code). The
backend is ``nccl`` when CUDA is usable, else ``gloo``. Nothing assumes a rank keeps its number
across restarts (torchrun's elastic agent may renumber workers). Source: PyTorch docs,
"torchrun (Elastic Launch)", environment variables.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainyard.training.errors import DistributedSetupError

__all__ = ["DistEnv", "Runtime", "NodeLayout", "init_distributed", "shutdown", "node_layout"]


def _int(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise DistributedSetupError(f"{name}={value!r} is not an integer") from exc


@dataclass(frozen=True)
class DistEnv:
    """This worker's place in the job, read from the environment.

    Attributes:
        rank, world_size: global rank and number of workers.
        local_rank, local_world_size: rank and worker count on this node.
        group_rank: the node's rank (torchrun's ``GROUP_RANK``), ``None`` if not given.
        launched: ``True`` when a launcher set ``RANK``/``WORLD_SIZE``.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    group_rank: int | None = None
    launched: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DistEnv:
        """Read the variables torchrun sets; a world of one when ``RANK`` is absent.

        Raises:
            DistributedSetupError: a variable is not an integer or ranks are out of range.
        """
        environ = os.environ if environ is None else environ
        if environ.get("RANK") is None and environ.get("WORLD_SIZE") is None:
            return cls()
        world_size = _int(environ, "WORLD_SIZE", None)
        rank = _int(environ, "RANK", None)
        if world_size is None or rank is None:
            raise DistributedSetupError("RANK and WORLD_SIZE must be set together")
        local_rank = _int(environ, "LOCAL_RANK", 0) or 0
        local_world_size = _int(environ, "LOCAL_WORLD_SIZE", world_size) or world_size
        env = cls(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            local_world_size=local_world_size,
            group_rank=_int(environ, "GROUP_RANK", None),
            launched=True,
        )
        env.check()
        return env

    def check(self) -> None:
        """Raise DistributedSetupError unless 0 <= rank < world_size and likewise locally."""
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise DistributedSetupError(
                f"RANK={self.rank} must lie in [0, WORLD_SIZE={self.world_size})"
            )
        if self.local_world_size < 1 or not 0 <= self.local_rank < self.local_world_size:
            raise DistributedSetupError(
                f"LOCAL_RANK={self.local_rank} must lie in [0, LOCAL_WORLD_SIZE={self.local_world_size})"
            )

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one that prints reports and writes metrics."""
        return self.rank == 0

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0: the one per node that writes the node's snapshot copy."""
        return self.local_rank == 0

    @property
    def node_key(self) -> str:
        """What identifies this worker's node: torchrun's GROUP_RANK, else the launcher's
        ``TRAINYARD_NODE``, else the host name."""
        if self.group_rank is not None:
            return f"group-{self.group_rank}"
        return os.environ.get("TRAINYARD_NODE") or socket.gethostname()


@dataclass(frozen=True)
class Runtime:
    """What :func:`init_distributed` chose: the backend and this worker's device."""

    backend: str
    device: torch.device

    @property
    def accelerator(self) -> str:
        """``GPU`` on CUDA, ``process`` on CPU: the word the summary uses for a worker."""
        return "GPU" if self.device.type == "cuda" else "process"


def init_distributed(env: DistEnv, timeout_s: float = 1800.0) -> Runtime:
    """Start the process group for ``env`` and pick the device.

    CUDA: device ``cuda:LOCAL_RANK`` (modulo the device count) and ``nccl``. CPU: ``gloo``,
    and unless ``OMP_NUM_THREADS`` is set, one intra-op thread per worker (as torchrun sets
    for several workers per node): the small models here run 10x slower with two threads
    when the cores are shared, and several "nodes" may share one machine.

    Raises:
        DistributedSetupError: the process group cannot be created.
    """
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        if not os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(1)
    timeout = timedelta(seconds=timeout_s)
    try:
        if env.launched:
            dist.init_process_group(
                backend,
                init_method="env://",
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
            )
        else:
            dist.init_process_group(
                backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
            )
    except (RuntimeError, ValueError) as exc:
        raise DistributedSetupError(f"cannot start the {backend} process group: {exc}") from exc
    return Runtime(backend=backend, device=device)


def shutdown() -> None:
    """Destroy the process group if there is one (idempotent)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@dataclass(frozen=True)
class NodeLayout:
    """How the workers spread over nodes.

    Attributes:
        nodes: number of distinct nodes.
        workers_per_node: workers on each node, in the order of the nodes' lowest rank.
    """

    nodes: int
    workers_per_node: tuple[int, ...]

    @property
    def workers(self) -> int:
        return sum(self.workers_per_node)


def node_layout(env: DistEnv) -> NodeLayout:
    """Gather every worker's node and count workers per node (a collective: call on all ranks).

    Heterogeneous jobs (one node with 2 workers, one with 1) come out as (2, 1).
    """
    entries: list[tuple[str, int] | None] = [None] * env.world_size
    dist.all_gather_object(entries, (env.node_key, env.rank))
    counts: dict[str, int] = {}
    gathered = [entry for entry in entries if entry is not None]  # every rank's, once gathered
    for key, _rank in sorted(gathered, key=lambda e: e[1]):
        counts[key] = counts.get(key, 0) + 1
    return NodeLayout(nodes=len(counts), workers_per_node=tuple(counts.values()))
