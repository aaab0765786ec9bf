"""The pools the server serves: read again from ``pools.yaml`` when it changes, looked up by
name for a spec, and described (``/api/pools``, ``/api/resources``)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from trainyard.backends.served import load_pool_file
from trainyard.engine.reconciler import Engine
from trainyard.errors import ConfigError, NotFoundError
from trainyard.pools import DEFAULT_POOL, Pool
from trainyard.server.answers import AmountsAnswer, PoolAnswer, PoolReloadAnswer, ResourceAnswer

log = logging.getLogger("trainyard.server.served_pools")


class ServedPools:
    """The engine's pools, kept in step with their file."""

    def __init__(
        self,
        engine: Engine,
        *,
        refused: dict[str, str] | None = None,
        pools_file: Path | None = None,
    ) -> None:
        """Args:
        refused: pools of pools.yaml not served (backend not available), with the reason.
        pools_file: the ``pools.yaml`` the engine's pools came from; given, it is read
            again whenever its modification time changes (``refresh``), so an edit takes
            effect without a restart. None: the pools never change.
        """
        self.engine = engine
        self.refused = dict(refused or {})
        """Pools of pools.yaml not served (backend not available), with the reason."""
        self.pools_file = pools_file
        self._mtime = _mtime_ns(pools_file)
        self._lock = threading.Lock()
        self._pending: list[str] = []  # busy pools whose edit waits
        self.error: str | None = None
        """Why the last read of ``pools_file`` was refused (the pools in use were kept)."""

    def refresh(self, *, force: bool = False) -> PoolReloadAnswer:
        """Read ``pools_file`` again when its modification time changed (or ``force``), or
        when an earlier edit waits for a busy pool; serve what it defines
        (``Engine.replace_pools``). A file that does not load is refused whole: the pools
        in use stay, the reason is kept in ``error`` (and logged).

        Returns:
            ``{"pools": [names], "refused": {name: reason}, "kept": [busy pools whose edit
            waits for their workflows], "error": reason or None, "file": path}``.

        Raises:
            ConfigError: with ``force``, the file does not load (says the pools are kept).
        """
        if self.pools_file is None:
            return self.status()
        with self._lock:
            mtime = _mtime_ns(self.pools_file)
            if not force and mtime == self._mtime and not self._pending:
                return self.status()
            self._mtime = mtime
            try:
                pools, refused = load_pool_file(self.pools_file)
            except ConfigError as exc:
                self.error = (
                    f"{exc}; the server keeps serving its pools "
                    f"({', '.join(sorted(self.engine.pools))})"
                )
                log.error("pools file refused: %s", self.error)
                if force:
                    raise ConfigError(self.error) from None
                return self.status()
            self._pending = self.engine.replace_pools(pools)
            self.refused, self.error = refused, None
            return self.status()

    def status(self) -> PoolReloadAnswer:
        """What ``refresh`` answers, without reading the file."""
        return {
            "pools": sorted(self.engine.pools),
            "refused": dict(self.refused),
            "kept": list(self._pending),
            "error": self.error,
            "file": str(self.pools_file) if self.pools_file else None,
        }

    def get(self, name: str | None) -> Pool:
        """The pool called ``name`` (default ``local``).

        Raises:
            NotFoundError: no such pool (the pools are named).
            ConfigError: the pool's backend is not available (``refused``).
        """
        self.refresh()
        name = name or DEFAULT_POOL
        if name not in self.engine.pools and name in self.refused:
            raise ConfigError(self.refused[name])
        if name not in self.engine.pools:
            pools = ", ".join(sorted(self.engine.pools))
            raise NotFoundError(f"unknown pool {name!r}; pools: {pools}")
        return self.engine.pools[name]

    def summaries(self) -> list[PoolAnswer]:
        """Every pool with its backend and node count."""
        self.refresh()
        return [
            {
                "name": p.name,
                "backend": p.backend,
                "nodes": len(p.nodes),
                "platforms": sorted(p.platforms),
                "max_retries": p.max_retries,
            }
            for p in self.engine.pools.values()
        ]

    def resources(self, pool: str | None = None) -> list[ResourceAnswer]:
        """Every node (of ``pool`` when given) with capacity, used and free (cpu, gpu,
        memory_bytes, storage_bytes), and ``virtual``: true when the capacity is declared,
        not measured (a pool without ``strict: true``, such as the rehearsal pool ``local``,
        whose virtual nodes share this machine). Raises NotFoundError for an unknown pool."""
        self.refresh()
        pools = [self.get(pool)] if pool else list(self.engine.pools.values())
        rows: list[ResourceAnswer] = []
        for p in pools:
            usage = self.engine.usage(p.name)
            rows += [_node_json(p, node, usage.get(node.name)) for node in p.nodes]
        return rows


def _mtime_ns(path: Path | None) -> int | None:
    """``path``'s modification time (ns), None when there is no such file."""
    try:
        return path.stat().st_mtime_ns if path is not None else None
    except FileNotFoundError:
        return None


def _node_json(pool: Pool, node: Any, used: dict[str, Any] | None) -> ResourceAnswer:
    held: AmountsAnswer = {
        "cpu": (used or {}).get("cpu", 0.0),
        "gpu": (used or {}).get("gpu", 0),
        "memory_bytes": (used or {}).get("memory_bytes", 0),
        "storage_bytes": (used or {}).get("storage_bytes", 0),
    }
    capacity: AmountsAnswer = {
        "cpu": node.cpu,
        "gpu": node.gpu,
        "memory_bytes": node.memory_bytes,
        "storage_bytes": node.storage_bytes,
    }
    free: AmountsAnswer = {
        "cpu": capacity["cpu"] - held["cpu"],
        "gpu": capacity["gpu"] - held["gpu"],
        "memory_bytes": capacity["memory_bytes"] - held["memory_bytes"],
        "storage_bytes": capacity["storage_bytes"] - held["storage_bytes"],
    }
    return {
        "pool": pool.name,
        "node": node.name,
        "platform": node.platform,
        "capacity": capacity,
        "used": held,
        "free": free,
        "virtual": not pool.strict,
    }
