"""The pools this machine serves: the pools file (``trainyard.pools`` parses it) with the
pools whose backend is unknown or not installed here set apart, each with the reason.

A refused pool is not served; a submit to it says why (``get_pool``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from trainyard.backends import available_backends, unavailable_reason
from trainyard.errors import ConfigError, NotFoundError
from trainyard.home import trainyard_home
from trainyard.pools import DEFAULT_POOL, Pool, load_pools

__all__ = ["load_pool_file", "load_usable_pools", "refused_pools", "get_pool"]

log = logging.getLogger("trainyard.pools")


def _backend_problem(path: Path, name: str, backend: str) -> str | None:
    """Why pool ``name`` cannot be served: its backend is unknown or not installed here."""
    reason = unavailable_reason(backend)
    if reason is None:
        return None
    return (
        f"pool {name!r}: backend {backend!r} is not available ({reason}); backends "
        f"available: {', '.join(available_backends())}. The pool is not served; change "
        f"its backend in {path}"
    )


def load_pool_file(path: Path | None = None) -> tuple[dict[str, Pool], dict[str, str]]:
    """Read the pools file: ``(usable pools, refused pools)``, the refused ones (whose
    backend is unknown or not installed here) by name with the reason, so the others are
    still served and a submit to a refused one says why.

    Raises:
        ConfigError: as ``pools.load_pools``.
    """
    path = path or trainyard_home() / "pools.yaml"
    pools = load_pools(path)
    refused: dict[str, str] = {}
    for name, pool in list(pools.items()):
        problem = _backend_problem(path, name, pool.backend)
        if problem is not None:
            refused[name] = problem
            del pools[name]
    return pools, refused


def load_usable_pools(path: Path | None = None) -> dict[str, Pool]:
    """The usable pools of the file (default ``$TRAINYARD_HOME/pools.yaml``); each refused
    one is logged as a warning with the reason.

    Raises:
        ConfigError: as ``pools.load_pools``.
    """
    pools, refused = load_pool_file(path)
    for problem in refused.values():
        log.warning("%s", problem)
    return pools


def refused_pools(path: Path | None = None) -> dict[str, str]:
    """The pools of the file whose backend is not available, with the reason (by name)."""
    return load_pool_file(path)[1]


def get_pool(name: str | None, path: Path | None = None) -> Pool:
    """The pool called ``name`` (``local`` when ``None``).

    Raises:
        NotFoundError: no such pool; the message lists the pools that exist.
        ConfigError: the pool's backend is not available here (``refused_pools``).
    """
    pools, refused = load_pool_file(path)
    name = name or DEFAULT_POOL
    if name in refused:
        raise ConfigError(refused[name])
    if name not in pools:
        raise NotFoundError(
            f"unknown pool {name!r}; pools: {', '.join(sorted(pools))} "
            f"(add one to {trainyard_home() / 'pools.yaml'})"
        )
    return pools[name]
